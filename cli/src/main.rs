use clap::Parser;

#[tokio::main]
async fn main() {
    let cli = headroom::Cli::parse();
    match headroom::run(cli).await {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
