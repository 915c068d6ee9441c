//! Test support for end-to-end tests: start the real `headroom` binary on a temporary data
//! directory with fake GPUs, talk to it over HTTP and through the CLI. The one place tests
//! share their setup.
//!
//! # Layout
//!
//! Everything a test uses by a short path is re-exported here
//! (`headroom_integration_tests::{Headroom, UpOptions, fake_job, ...}`).
//!
//! * `headroom`: `Headroom`, a `headroom up` on a temporary data directory, started with
//!   `UpOptions`; its CLI, typed client and waits.
//! * `standalone`: a coordinator and agents started as separate binaries.
//! * `binaries`: the workspace's binaries a test runs, and the commands given fake jobs.
//! * `process`: processes a test holds: `Proc` in the background, `KillOnDrop`, a bystander.
//! * `procfs`: processes looked at through `/proc`: an agent's scope, parents, liveness.
//! * `http`: the shared typed client, requests by full URL, a free loopback port.
//! * `wait`: polling until a condition holds.
//! * `premises`: what the suite needs of the machine (CI, root, a second Unix user).
//! * `records`: what fake jobs recorded, and their deaths seen from outside.
//! * `prom`: Prometheus pages parsed with a real parser.
//! * `receivers`: where alerts land: a webhook receiver and a real SMTP server.
//! * `postgres`: a throwaway PostgreSQL cluster.
//! * `link`: connections a test can cut or black-hole.
//! * `tls`: a TLS front as a lab's proxy puts one before a coordinator.
//! * `tables`: tables the CLI prints, read back.

mod binaries;
mod headroom;
mod http;
mod link;
mod postgres;
mod premises;
mod process;
mod procfs;
pub mod prom;
pub mod receivers;
pub mod records;
pub mod standalone;
mod tables;
pub mod tls;
mod wait;

pub use binaries::{
    binary, books_for, fake_job, fake_job_spec, headroom_as, headroom_ok, path_with_binaries,
    run_binary,
};
pub use headroom::{Headroom, UpOptions};
pub use http::{
    block_on, client_for, free_port, http_get, http_get_text, http_post, http_post_text,
};
pub use link::{DroppingLink, Link};
pub use postgres::Postgres;
pub use premises::{ci, open_to_jobs, other_user, premise_missing};
pub use process::{KillOnDrop, Proc, bystander};
pub use procfs::{
    alive, children_of, is_waiting_supervisor, kill_scope, kill_supervisors, parent_of, scope_pids,
    stat_fields, supervisor_pids,
};
pub use records::{Record, read_records};
pub use tables::csv_table;
pub use wait::wait_until;
