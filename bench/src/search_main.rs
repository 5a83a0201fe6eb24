//! `mcp-gateway-search-bench`: the gateway's tool search in process (`search.rs` of the
//! library says what it measures). A binary of its own so that it runs with the
//! gateway's allocator, which the load tool does not use.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

#[derive(Parser)]
#[command(name = "mcp-gateway-search-bench", about = "tool search: recall, latency, rebuild")]
struct Args {
    #[command(flatten)]
    opts: mcp_gateway_bench::search::Opts,
    /// Print the target rows as JSON on stdout (for `mcp-gateway-bench --mode search`).
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rows = mcp_gateway_bench::search::run(&args.opts)?;
    if args.json {
        println!("{}", serde_json::to_string(&rows)?); // stdout-ok
    } else {
        println!("targets:"); // stdout-ok
        for r in &rows {
            let verdict = if r.pass { "PASS" } else { "FAIL" };
            println!("  {verdict} {}: {} (target {})", r.target, r.measured, r.goal);
            // stdout-ok
        }
    }
    Ok(())
}
