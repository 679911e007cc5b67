//! `arbor`: the command line. `arbor serve` runs the daemon
//! (`arbor-daemon`); the other commands are clients of its API
//! (`arbor-api`), or offline commands (`pool create`, `tls init`, and
//! `check`, `pool grow`, `pool upgrade` given a PATH). See docs/CLI.md.

mod cli;
mod commands;
mod exit;
mod output;
mod tls_init;
mod tls_revoke;

use std::io::{ErrorKind, IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
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
/// lifecycle by default, commands only warnings. The daemon run by systemd
/// with its standard error on the journal logs to the journal instead,
/// each event's fields as fields of its entry (`ARBOR_VOLUME`,
/// `ARBOR_ERROR`, ...: docs/SERVICE.md), falling back to stderr if the
/// journal cannot be reached.
fn init_logging(command: &Command) {
    let serve = matches!(command, Command::Serve(_));
    let default = if serve { "info" } else { "warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    if serve && stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(journal) => {
                let journal = journal
                    .with_field_prefix(Some("ARBOR".to_owned()))
                    .with_syslog_identifier("arbor".to_owned());
                tracing_subscriber::registry()
                    .with(filter)
                    .with(journal)
                    .init();
                return;
            }
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "arbor: cannot log to the journal ({e}): logging to standard error"
                );
            }
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Whether standard error is the journal's stream: systemd then sets
/// `JOURNAL_STREAM` to its device and inode (`sd_journal_stream_fd(3)`,
/// `systemd.exec(5)`); a child whose stderr went elsewhere does not match.
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    stream.to_str() == Some(format!("{}:{}", meta.dev(), meta.ino()).as_str())
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
