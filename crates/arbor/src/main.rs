//! `arbor`: manage a pool of thin volumes offline, or run the daemon that
//! serves it. See docs/CLI.md.

mod cli;
mod client;
mod commands;
mod control;
mod daemon;
mod model;
mod nbd_export;
mod output;
mod pool_file;
mod size;
mod transfer;

use std::ffi::OsString;
use std::io::{ErrorKind, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser};
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command, PoolPath, ViaDaemon};
use commands::Session;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let result = if cli::wants_daemon(&args) {
        parse::<ViaDaemon>(&args).map(run_via_daemon)
    } else {
        parse::<PoolPath>(&args).map(run_local)
    };
    match result {
        Ok(Ok(code)) => code,
        Ok(Err(err)) => report(&err),
        Err(code) => code,
    }
}

/// Parses the command line; usage errors, `--help` and `--version` end here
/// with their exit status (1 for errors, like every other failure).
fn parse<T: Args>(args: &[OsString]) -> Result<Cli<T>, ExitCode> {
    Cli::<T>::try_parse_from(args).map_err(|err| {
        // Nothing better to do if the terminal is gone.
        let _ = err.print();
        if err.use_stderr() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    })
}

fn run_local(cli: Cli<PoolPath>) -> Result<ExitCode> {
    init_logging(&cli.command);
    commands::execute(cli.command, |target| Session::local(&target.pool))
}

fn run_via_daemon(cli: Cli<ViaDaemon>) -> Result<ExitCode> {
    init_logging(&cli.command);
    let address = cli
        .daemon
        .context("--daemon needs the address of the daemon's API")?;
    if let Some(name) = cli.command.is_local_only() {
        anyhow::bail!("`arbor {name}` works on a pool directly and cannot go through --daemon");
    }
    commands::execute(cli.command, |_| Session::daemon(&address))
}

/// Logs go to stderr, filtered by `RUST_LOG`; the daemon reports its
/// lifecycle by default, commands only warnings.
fn init_logging<T: Args>(command: &Command<T>) {
    let default = if matches!(command, Command::Serve(_)) {
        "info"
    } else {
        "warn"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn report(err: &anyhow::Error) -> ExitCode {
    // A reader that went away (`arbor list | head -1`) is not a failure.
    let broken_pipe = err
        .downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == ErrorKind::BrokenPipe);
    if broken_pipe {
        return ExitCode::SUCCESS;
    }
    let _ = writeln!(std::io::stderr(), "arbor: error: {}", render(err));
    ExitCode::FAILURE
}

/// The error and its causes joined by ": ", skipping a cause whose text the
/// message before it already ends with (errors that both print and expose
/// their source would otherwise say everything twice).
fn render(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendering_skips_causes_already_printed() {
        let inner = anyhow::anyhow!("bad checksum");
        let outer = inner.context("block 7 is damaged: bad checksum");
        let top = outer.context("cannot open pool");
        assert_eq!(
            render(&top),
            "cannot open pool: block 7 is damaged: bad checksum"
        );
    }
}
