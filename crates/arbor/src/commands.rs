//! Running a parsed command line.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use arbor_engine::{CreateOptions, OpenOptions, Pool};
use clap::Args;

use crate::cli::{Command, ManageCommand, PoolCommand, PoolCreateArgs, ServeArgs};
use crate::client::DaemonClient;
use crate::control::{Control, PoolControl};
use crate::daemon::{self, ApiAddress, ServeConfig};
use crate::output::{self, emit, emit_as};
use crate::pool_file::OpenPool;
use crate::size::ByteSize;
use crate::transfer::{self, Transferred};

/// What a management command talks to: a pool this process opened, or a daemon.
pub enum Session {
    Local {
        pool: OpenPool,
        control: PoolControl,
    },
    Daemon(DaemonClient),
}

impl Session {
    pub fn local(path: &Path) -> Result<Self> {
        let pool = OpenPool::open(path, &OpenOptions::default())?;
        let control = PoolControl::new(pool.pool.clone(), pool.path.clone());
        Ok(Session::Local { pool, control })
    }

    pub fn daemon(address: &Path) -> Result<Self> {
        DaemonClient::new(address).map(Session::Daemon)
    }

    fn control(&self) -> &dyn Control {
        match self {
            Session::Local { control, .. } => control,
            Session::Daemon(client) => client,
        }
    }

    /// The pool itself, for data transfer, which the API does not offer.
    fn pool(&self, command: &str) -> Result<&Pool> {
        match self {
            Session::Local { pool, .. } => Ok(&pool.pool),
            Session::Daemon(_) => bail!(
                "`arbor {command}` needs the pool itself and cannot go through --daemon; \
                 stop the daemon, or use its NBD exports"
            ),
        }
    }

    /// Closes a local pool with a final commit, reporting its failure.
    fn finish(self) -> Result<()> {
        match self {
            Session::Local { pool, control } => {
                drop(control);
                pool.close()
            }
            Session::Daemon(_) => Ok(()),
        }
    }
}

/// Runs `command`; `connect` turns its pool argument into a session.
pub fn execute<T: Args>(
    command: Command<T>,
    connect: impl Fn(&T) -> Result<Session>,
) -> Result<ExitCode> {
    match command {
        Command::Pool {
            command: PoolCommand::Create(args),
        } => create_pool(&args),
        Command::Pool {
            command: PoolCommand::Info { target, json },
        } => with_session(connect(&target)?, |session| {
            emit_as(&session.control().pool_info()?, json, output::pool)?;
            Ok(ExitCode::SUCCESS)
        }),
        Command::Manage(command) => with_session(connect(command.target())?, |session| {
            manage(command, session)
        }),
        Command::Serve(args) => serve(args),
    }
}

/// Runs `work` and closes the session, whether or not `work` succeeded.
fn with_session(
    session: Session,
    work: impl FnOnce(&Session) -> Result<ExitCode>,
) -> Result<ExitCode> {
    let result = work(&session);
    let finished = session.finish();
    let code = result?;
    finished?;
    Ok(code)
}

fn manage<T: Args>(command: ManageCommand<T>, session: &Session) -> Result<ExitCode> {
    let c = session.control();
    match command {
        ManageCommand::Check { json, .. } => {
            let report = c.check()?;
            emit_as(&report, json, output::check)?;
            if !report.clean {
                return Ok(ExitCode::FAILURE);
            }
        }
        ManageCommand::Reclaim { .. } => {
            let done = c.reclaim()?;
            emit(&format!(
                "reclaimed: {} metadata nodes processed\n",
                done.processed
            ))?;
        }
        ManageCommand::Create { volume, size, .. } => {
            let view = c.create_volume(&volume, size.0)?;
            emit(&output::volume_line("created", &view))?;
        }
        ManageCommand::Snapshot { snapshot, .. } => {
            emit(&output::volume_line("created", &c.snapshot(&snapshot)?))?;
        }
        ManageCommand::Clone { snapshot, name, .. } => {
            let view = c.clone_snapshot(&snapshot, &name)?;
            emit(&output::volume_line(
                &format!("cloned {snapshot} to"),
                &view,
            ))?;
        }
        ManageCommand::Delete { name, .. } => {
            c.delete(&name)?;
            emit(&format!("deleted {name}\n"))?;
        }
        ManageCommand::Rollback {
            volume, snapshot, ..
        } => {
            c.rollback(&volume, &snapshot)?;
            emit(&format!("rolled {volume} back to {snapshot}\n"))?;
        }
        ManageCommand::Resize { volume, size, .. } => {
            let view = c.resize(&volume, size.0)?;
            emit(&format!("resized {volume} to {}\n", ByteSize(view.size)))?;
        }
        ManageCommand::Rename { from, to, .. } => {
            c.rename(&from, &to)?;
            emit(&format!("renamed {from} to {to}\n"))?;
        }
        ManageCommand::List { json, .. } => emit_as(&c.list()?, json, |v| output::volumes(v))?,
        ManageCommand::Stats { name, json, .. } => {
            emit_as(&c.stats(&name)?, json, output::stats)?;
        }
        ManageCommand::Diff { a, b, json, .. } => {
            emit_as(&c.diff(&a, &b)?, json, |r| output::diff(r))?;
        }
        ManageCommand::Import { volume, file, .. } => {
            let done = transfer::import(session.pool("import")?, &volume, &file)?;
            let what = format!("imported {} into {volume}", file.display());
            emit(&transfer_line(&what, &done))?;
        }
        ManageCommand::Export { name, file, .. } => {
            let done = transfer::export(session.pool("export")?, &name, &file)?;
            let what = format!("exported {name} to {}", file.display());
            emit(&transfer_line(&what, &done))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn transfer_line(what: &str, done: &Transferred) -> String {
    format!(
        "{what}: {} written, {} of zeros skipped\n",
        ByteSize(done.written),
        ByteSize(done.skipped)
    )
}

fn create_pool(args: &PoolCreateArgs) -> Result<ExitCode> {
    let options = CreateOptions {
        chunk_size: match args.chunk_size {
            Some(size) => {
                u32::try_from(size.0).with_context(|| format!("chunk size {size} is too large"))?
            }
            None => arbor_engine::DEFAULT_CHUNK_SIZE,
        },
        metadata_bytes: args.metadata_size.map(|s| s.0),
    };
    let pool = OpenPool::create(&args.pool, args.size.map(|s| s.0), &options, args.force)?;
    let stats = pool.pool.pool_stats()?;
    pool.close()?;
    emit(&format!(
        "created pool {}: {} of data space in {} chunks, {} of metadata space\n",
        args.pool.display(),
        ByteSize(stats.data_bytes),
        ByteSize(stats.chunk_size),
        ByteSize(stats.metadata_bytes),
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn serve(args: ServeArgs) -> Result<ExitCode> {
    daemon::serve(ServeConfig {
        pool: args.pool,
        api: match (args.api_socket, args.api) {
            (Some(path), _) => Some(ApiAddress::Unix(path)),
            (None, Some(addr)) => Some(ApiAddress::Tcp(addr)),
            (None, None) => None,
        },
        nbd_socket: args.nbd_socket,
        nbd_tcp: args.nbd_tcp,
        reclaim_rate: args.reclaim_rate,
        commit_interval: args.commit_interval.into(),
        cache_bytes: usize::try_from(args.cache_size.0).context("--cache-size is too large")?,
    })?;
    Ok(ExitCode::SUCCESS)
}
