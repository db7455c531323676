//! The `rota` command. All behaviour lives in the library (`rota::cli`).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = rota::cli::Cli::parse();
    rota::cli::init_tracing(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("rota: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(rota::cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rota: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
