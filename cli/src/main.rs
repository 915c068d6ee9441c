//! `headroom`: the command line. `up` and `doctor` become `headroom-node` (`node::exec`).

fn main() {
    let result = headroom::parse_client_args().and_then(|parsed| match parsed {
        headroom::Parsed::HandOver(name) => Err(headroom::node::exec(&name).into()),
        // One thread: a command makes a few requests, and worker threads would cost a short
        // command a good part of its start.
        headroom::Parsed::Command(cli) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)?
            .block_on(headroom::run(cli)),
    });
    headroom::exit_with(result)
}
