//! `headroom-coordinator`: the REST API on its own (agents run elsewhere).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use headroom_coordinator::store::Store;
use headroom_coordinator::store::postgres::{PostgresStore, redact_url};
use headroom_coordinator::store::sqlite::SqliteStore;
use headroom_coordinator::{Application, CoordinatorSettings};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "headroom-coordinator",
    version,
    about = "headroom coordinator: REST API, store, placement"
)]
struct Args {
    /// PostgreSQL (`postgres://user:password@host:port/dbname`) for several coordinator
    /// replicas; absent: the embedded SQLite file in the data dir.
    #[arg(long, env = "HEADROOM_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// A file holding the database URL (one line, mode 0600), so its password is in no
    /// process's arguments or environment; systemd's `LoadCredential=database-url` is read
    /// when neither is given.
    #[arg(long, env = "HEADROOM_DATABASE_URL_FILE")]
    database_url_file: Option<PathBuf>,
    /// A TOML file of settings (keys are the flags' names); variables and flags win over it.
    #[arg(long, env = "HEADROOM_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: CoordinatorSettings,
}

/// PostgreSQL when a URL is given, else the embedded SQLite file in `data_dir`.
async fn open_store(url: Option<&str>, data_dir: &Path) -> anyhow::Result<Arc<dyn Store>> {
    match url.map(str::trim).filter(|u| !u.is_empty()) {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let store = PostgresStore::connect(url).await.with_context(|| {
                format!(
                    "--database-url (HEADROOM_DATABASE_URL) {}: cannot open the store",
                    redact_url(url)
                )
            })?;
            Ok(Arc::new(store))
        }
        Some(url) => anyhow::bail!(
            "--database-url (HEADROOM_DATABASE_URL) must be a postgres:// or postgresql:// URL, \
             got `{}`; leave it unset for the embedded store",
            redact_url(url)
        ),
        None => {
            let db = data_dir.join("headroom.db");
            let store = tokio::task::spawn_blocking(move || SqliteStore::open(&db))
                .await?
                .context("opening the store")?;
            Ok(Arc::new(store))
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    headroom_shared::logging::init("info");
    // First: a stop signal during start-up must stop us cleanly too.
    let stop = CancellationToken::new();
    headroom_shared::signals::cancel_on_stop_signal(stop.clone())?;
    let args: Args = headroom_shared::settings::parse()?;
    headroom_coordinator::app::check_exposure(&args.settings.config(PathBuf::new())?)?;
    // The store (env values, token hashes) and logs are for it alone.
    headroom_coordinator::app::private_umask();
    let given = args
        .settings
        .data_dir
        .clone()
        .unwrap_or_else(|| headroom_shared::datadir::service_default("headroom", ".headroom"));
    let data_dir = &headroom_shared::datadir::adopt(&given)?;
    let config = args.settings.config(data_dir.clone())?;
    headroom_coordinator::app::private_dir(data_dir, 0o700).with_context(|| {
        format!(
            "making the data dir {} private (mode 0700): this user must own it",
            data_dir.display()
        )
    })?;
    let url = headroom_shared::secret::resolve(
        headroom_shared::secret::SecretSource {
            flag: "--database-url",
            file_flag: "--database-url-file",
            credential: "database-url",
        },
        args.database_url.as_deref(),
        args.database_url_file.as_deref(),
    )?;
    let store = open_store(url.as_deref(), data_dir).await?;
    let app = Application::build(config, store).await?;
    println!(
        "headroom: coordinator listening on http://{}",
        app.local_addr()
    );
    app.run(stop).await?;
    Ok(())
}
