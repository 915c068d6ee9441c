//! `headroom`: the command line. `up` and `doctor` become `headroom-node` (`node::exec`).

fn main() {
    let result = headroom::parse_args().and_then(|cli| {
        // One thread: a command makes a few requests, and worker threads would cost a short
        // command a good part of its start.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)?
            .block_on(headroom::run(cli))
    });
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
