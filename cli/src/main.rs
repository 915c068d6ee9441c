#[tokio::main]
async fn main() {
    let result = match headroom::parse_args() {
        Ok(cli) => headroom::run(cli).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
