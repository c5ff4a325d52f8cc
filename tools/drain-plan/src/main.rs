//! `kubectl drain-plan NODE`: what the terminating hook's drain of a node would do, now.

use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = drain_plan::Args::parse();
    match drain_plan::run(&args).await {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("drain-plan: {error}");
            ExitCode::FAILURE
        }
    }
}
