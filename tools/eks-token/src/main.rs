//! `eks-token`: prints an EKS token as a kubectl `ExecCredential`, like `aws eks get-token`.

use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = eks_token::Args::parse();
    match eks_token::run(&args).await {
        Ok(output) => {
            for warning in &output.warnings {
                eprintln!("{warning}");
            }
            print!("{}", output.stdout);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("eks-token: {error}");
            ExitCode::FAILURE
        }
    }
}
