fn main() {
    // An attempt's supervisor process: supervises its attempt and exits.
    headroom_agent::supervisor::run_if_supervisor();
    let result = match (headroom::parse_args(), tokio::runtime::Runtime::new()) {
        (Ok(cli), Ok(rt)) => rt.block_on(headroom::run(cli)),
        (Err(e), _) => Err(e),
        (_, Err(e)) => Err(e.into()),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
