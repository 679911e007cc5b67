//! `arbor`: the command line. `arbor serve` runs the daemon
//! (`arbor-daemon`); the other commands are clients of its API
//! (`arbor-api`), or offline commands (`pool create`, `tls init`, and
//! `check`, `pool grow`, `pool upgrade` given a PATH). See docs/CLI.md.

mod cli;
mod commands;
mod exit;
mod output;
mod tls_init;

use std::io::{ErrorKind, IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command};
use exit::Exit;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // Nothing better to do if the terminal is gone.
            let _ = err.print();
            return if err.use_stderr() {
                Exit::Usage.code()
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_logging(&cli.command);
    match commands::execute(cli) {
        Ok(code) => code,
        Err(err) => report(&err),
    }
}

/// Logs go to stderr, filtered by `RUST_LOG`; the daemon reports its
/// lifecycle by default, commands only warnings.
fn init_logging(command: &Command) {
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
    Exit::of(err).code()
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
