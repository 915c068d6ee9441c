//! `headroom-node`: `headroom up` and `headroom doctor` (which `headroom` becomes for them),
//! and the attempt supervisors of `up`'s agent.

fn main() {
    // An attempt's supervisor process: supervises its attempt and exits.
    headroom_agent::supervisor::run_if_supervisor();
    if let Err(e) = headroom::node::check_client_version() {
        headroom::exit_with(Err(e.into()))
    }
    let result = headroom::parse_args().and_then(|cli| {
        headroom::runtime_for(&cli.command)
            .map_err(anyhow::Error::from)?
            .block_on(headroom::run_node(cli))
    });
    headroom::exit_with(result)
}
