//! Running a parsed command line: the daemon, the offline commands, and the
//! client commands, which each make one or two API calls.

use std::io::{IsTerminal, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use arbor_engine::{CreateOptions, OpenOptions};
use clap::CommandFactory;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::cli::{
    BackupCommand, BackupInitArgs, Cli, Command, CompressionArg, ConfigCommand, FormatArg,
    KeyCommand, OriginCommand, PolicyCommand, PoolCommand, PoolCreateArgs, PoolGrowArgs,
    ReceiveArgs, ReplicaCommand, ScrubCommand, SendArgs, ServeArgs, SnapshotCommand, TokenCommand,
    VolumeCommand,
};
use crate::exit::{Exit, Fail};
use crate::output::{self, emit};
use crate::tls_init::{self, TlsCommand};
use arbor_api::client::DaemonClient;
use arbor_api::model::{
    BackupPruneRequest, BackupRequest, CheckView, Durability, GrowRequest, PolicyRequest,
    PruneRequest, ReplicaAddRequest, RestoreRequest, SendQuery, StreamCompression, StreamFormat,
    TokenRequest, VerifyRequest,
};
use arbor_api::size::ByteSize;
use arbor_daemon::pool_file::{self, IoMode, OpenPool};
use arbor_daemon::{config, views};

/// How results are printed: `--json` or human text.
struct Printer {
    json: bool,
}

impl Printer {
    /// Prints `value` as JSON, or as the text `human` renders.
    fn show<T: Serialize>(&self, value: &T, human: impl FnOnce(&T) -> String) -> Result<()> {
        output::emit_as(value, self.json, human)
    }

    /// A confirmation line for people; for scripts, `{"done": ACTION, "name": NAME}`.
    fn done(&self, action: &str, name: &str, text: String) -> Result<()> {
        #[derive(Serialize)]
        struct Done<'a> {
            done: &'a str,
            name: &'a str,
        }
        self.show(&Done { done: action, name }, |_| text)
    }
}

pub fn execute(cli: Cli) -> Result<ExitCode> {
    let printer = Printer { json: cli.json };
    let data_dir = cli.data_dir();
    let remote = cli.remote();
    match cli.command {
        Command::Serve(args) => serve(cli.data_dir, &args),
        Command::Pool(PoolCommand::Create(args)) => create_pool(&args, &printer),
        Command::Check {
            path: Some(path),
            repair,
        } => check_offline(&path, repair, &printer),
        Command::Pool(PoolCommand::Grow(PoolGrowArgs {
            path: Some(path),
            size,
            metadata_size,
        })) => {
            let request = grow_request(size, metadata_size);
            let grown = with_offline_pool(&path, |open| {
                with_spinner(&format!("growing {}", path.display()), || {
                    pool_file::grow(&open.pool, &path, &views::grow_options(&request))
                        .map_err(anyhow::Error::from)
                })
            })?;
            printer.show(&grown, output::grow)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Pool(PoolCommand::Upgrade { path: Some(path) }) => {
            let upgraded = with_offline_pool(&path, |open| Ok(pool_file::upgrade(&open.pool)?))?;
            printer.show(&upgraded, output::upgrade)?;
            Ok(ExitCode::SUCCESS)
        }
        // The same key file for both: 32 random bytes as 64 hex digits.
        Command::Key(KeyCommand::New { file }) => new_key(
            &printer,
            &file,
            "a volume key",
            "an encrypted volume cannot be read",
        ),
        Command::Backup(BackupCommand::NewKey { file }) => new_key(
            &printer,
            &file,
            "a repository key",
            "the backups cannot be read",
        ),
        Command::Backup(BackupCommand::Init(args)) => {
            printer.show(&backup_init(&args)?, output::backup_init)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Tls(TlsCommand::Init(args)) => {
            printer.show(&tls_init::init(&args)?, tls_init::human)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Tls(TlsCommand::Add(args)) => {
            printer.show(&tls_init::add(&args)?, tls_init::add_human)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Tls(TlsCommand::Revoke(args)) => {
            printer.show(&crate::tls_revoke::revoke(&args)?, crate::tls_revoke::human)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "arbor", &mut out);
            emit(&String::from_utf8_lossy(&out))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Manpages { dir } => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let written = write_manpages(Cli::command(), &dir)?;
            emit(&format!("wrote {written} man pages to {}\n", dir.display()))?;
            Ok(ExitCode::SUCCESS)
        }
        command => {
            let client = DaemonClient::new(&data_dir, &remote)?;
            client_command(command, &client, &printer)
        }
    }
}

fn client_command(command: Command, c: &DaemonClient, p: &Printer) -> Result<ExitCode> {
    match command {
        Command::Volume(VolumeCommand::Create {
            name,
            size,
            layout,
            qos,
            encrypt,
            key,
            encryption_unit,
        }) => {
            let qos = Some(qos.request()).filter(|q| !q.is_empty());
            let encryption = if encrypt {
                Some(arbor_api::model::EncryptionRequest {
                    key: user_key(&key)?,
                    unit: encryption_unit.map(|u| u.parse()).transpose()?,
                })
            } else {
                None
            };
            p.show(
                &c.create_volume(&name, size.0, layout, qos, encryption)?,
                |v| output::volume_line("created", v),
            )?;
        }
        Command::Key(KeyCommand::Load { name, key }) => {
            p.show(&c.key_load(&name, user_key(&key)?)?, |v| {
                output::volume_line("unlocked", v)
            })?;
        }
        Command::Key(KeyCommand::Unload { name }) => {
            p.show(&c.key_unload(&name)?, |v| output::volume_line("locked", v))?;
        }
        Command::Key(KeyCommand::Change { name, key, new_key }) => {
            let new = user_key(&new_key.as_key())?;
            p.show(&c.key_change(&name, user_key(&key)?, new)?, |v| {
                output::volume_line("key changed", v)
            })?;
        }
        Command::Key(KeyCommand::New { .. }) => {
            anyhow::bail!("internal error: this command does not go through the daemon")
        }
        Command::Volume(VolumeCommand::Set { name, qos }) => {
            let change = qos.request();
            if change.is_empty() {
                return Err(Fail::new(
                    Exit::Usage,
                    "give at least one limit to change: --max-iops, --max-read-iops, \
                     --max-write-iops, --max-bandwidth, --max-read-bandwidth, \
                     --max-write-bandwidth or --burst"
                        .to_owned(),
                )
                .into());
            }
            p.show(&c.set_qos(&name, &change)?, output::qos_line)?;
        }
        Command::Volume(VolumeCommand::List { tree }) => {
            let list = c.list()?;
            p.show(&list, |l| {
                if tree {
                    output::volume_tree(l)
                } else {
                    output::volumes(l)
                }
            })?;
        }
        Command::Volume(VolumeCommand::Resize { name, size }) => {
            p.show(&c.resize(&name, size.0)?, |v| {
                format!("resized {name} to {}\n", ByteSize(v.size))
            })?;
        }
        Command::Volume(VolumeCommand::Stats { name }) => {
            p.show(&c.stats(&name)?, output::stats)?
        }
        Command::Snapshot(SnapshotCommand::Create { names, deferred }) => match &names[..] {
            [name] => p.show(&c.snapshot(name, durability(deferred))?, |v| {
                output::snapshot_line(v, deferred)
            })?,
            _ => p.show(&c.snapshot_group(&names, durability(deferred))?, |list| {
                list.iter()
                    .map(|v| output::snapshot_line(v, deferred))
                    .collect::<String>()
            })?,
        },
        Command::Origin(command) => origin(command, c, p)?,
        Command::Policy(command) => policy(command, c, p)?,
        Command::Prune { volume, dry_run } => {
            let request = PruneRequest { volume, dry_run };
            p.show(&c.prune(&request)?, output::prune)?;
        }
        Command::Snapshot(SnapshotCommand::List { volume }) => {
            p.show(&c.snapshots(volume.as_deref())?, |l| output::volumes(l))?;
        }
        Command::Clone {
            snapshot,
            name,
            deferred,
            key,
            new_key,
        } => {
            let own = new_key.given();
            let given = key.key_file.is_some() || key.passphrase_file.is_some();
            let view = match (own, given) {
                (false, false) => c.clone_snapshot(&snapshot, &name, durability(deferred))?,
                (true, true) => {
                    let new = user_key(&new_key.as_key())?;
                    c.clone_with_key(&snapshot, &name, user_key(&key)?, new)?
                }
                (true, false) => {
                    return Err(Fail::new(
                        Exit::Usage,
                        "a clone with a key of its own needs the snapshot's key too: \
                         --key-file FILE or --passphrase-file FILE"
                            .to_owned(),
                    )
                    .into())
                }
                (false, true) => {
                    return Err(Fail::new(
                        Exit::Usage,
                        "the snapshot's key goes with the clone's own: --new-key-file FILE or \
                         --new-passphrase-file FILE (a clone shares its snapshot's key \
                         without them)"
                            .to_owned(),
                    )
                    .into())
                }
            };
            p.show(&view, |v| {
                output::volume_line(&format!("cloned {snapshot} to"), v)
            })?;
        }
        Command::Destroy { name, force } => {
            c.destroy(&name, force)?;
            p.done(
                "destroyed",
                &name,
                format!("destroyed {name}; its space is reclaimed in the background\n"),
            )?;
        }
        Command::Rollback { snapshot } => {
            let (volume, _) = arbor_engine::split_snapshot_name(&snapshot)?;
            let volume = volume.to_owned();
            p.show(&c.rollback(&volume, &snapshot)?, |_| {
                format!("rolled {volume} back to {snapshot}\n")
            })?;
        }
        Command::Rename { from, to } => {
            p.show(&c.rename(&from, &to)?, |_| {
                format!("renamed {from} to {to}\n")
            })?;
        }
        Command::Diff { a, b } => {
            let ranges = with_spinner(&format!("comparing {a} and {b}"), || c.diff(&a, &b))?;
            p.show(&ranges, |r| output::diff(r))?;
        }
        Command::Hold { snapshot, tag } => {
            p.show(&c.hold(&snapshot, &tag)?, |v| {
                format!("{snapshot} is held by: {}\n", v.holds.join(", "))
            })?;
        }
        Command::Release { snapshot, tag } => {
            p.show(&c.release(&snapshot, &tag)?, |v| {
                if v.holds.is_empty() {
                    format!("released {tag}: {snapshot} is not held any more\n")
                } else {
                    format!(
                        "released {tag}: {snapshot} is still held by {}\n",
                        v.holds.join(", ")
                    )
                }
            })?;
        }
        Command::Replica(command) => replica(command, c, p)?,
        Command::Backup(command) => backup(command, c, p)?,
        Command::Token(command) => token(command, c, p)?,
        Command::Send(args) => send(&args, c, p)?,
        Command::Receive(args) => receive(&args, c, p)?,
        Command::Pool(PoolCommand::Status) => p.show(&c.pool_status()?, output::pool)?,
        Command::Config(ConfigCommand::Reload) => p.show(&c.config_reload()?, output::reload)?,
        Command::Scrub(ScrubCommand::Status) => p.show(&c.scrub_status()?, output::scrub)?,
        Command::Scrub(ScrubCommand::Stop) => p.show(&c.scrub_stop()?, output::scrub)?,
        Command::Scrub(ScrubCommand::Schedule { spec, clear }) => {
            let view = if clear {
                c.scrub_schedule_clear()?
            } else {
                c.scrub_schedule_set(&spec.join(" "))?
            };
            p.show(&view, output::scrub)?;
        }
        Command::Scrub(ScrubCommand::Start { wait }) => {
            let started = c.scrub_start()?;
            if !wait {
                p.show(&started, output::scrub)?;
                return Ok(ExitCode::SUCCESS);
            }
            let bar = byte_progress(started.live_bytes, "scrubbing");
            let done = loop {
                let now = c.scrub_status()?;
                bar.set_length(now.live_bytes.max(now.bytes_read));
                bar.set_position(now.bytes_read);
                if now.state != "running" {
                    break now;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            };
            bar.finish_and_clear();
            p.show(&done, output::scrub)?;
            if done.state != "finished" {
                return Err(Fail::new(
                    Exit::Failure,
                    format!(
                        "the scrub {}{}",
                        done.state,
                        done.last_error
                            .map(|e| format!(": {e}"))
                            .unwrap_or_default()
                    ),
                )
                .into());
            }
            if done.damaged_blocks > 0 || done.metadata_problems.is_some_and(|n| n > 0) {
                return Err(Fail::new(
                    Exit::Damaged,
                    "the scrub found damage: arbor pool damage and arbor check list it".to_owned(),
                )
                .into());
            }
        }
        Command::Pool(PoolCommand::Damage) => {
            let damage = c.damage()?;
            p.show(&damage, output::damage)?;
            let count = damage.blocks.len() as u64 + damage.unlisted;
            if count > 0 {
                return Err(Fail::new(
                    Exit::Damaged,
                    format!("{count} data blocks of the pool are damaged"),
                )
                .into());
            }
        }
        Command::Pool(PoolCommand::Flush) => {
            c.flush()?;
            p.done(
                "flushed",
                "pool",
                "flushed: every completed write and deferred snapshot is durable\n".to_owned(),
            )?;
        }
        Command::Pool(PoolCommand::Reclaim) => {
            let done = with_spinner("reclaiming destroyed volumes' space", || c.reclaim())?;
            p.show(&done, |d| {
                format!("reclaimed: {} metadata nodes processed\n", d.processed)
            })?;
        }
        Command::Pool(PoolCommand::Grow(args @ PoolGrowArgs { path: None, .. })) => {
            let request = grow_request(args.size, args.metadata_size);
            let grown = with_spinner("growing the pool", || c.grow(&request))?;
            p.show(&grown, output::grow)?;
        }
        Command::Pool(PoolCommand::Upgrade { path: None }) => {
            p.show(&c.upgrade()?, output::upgrade)?
        }
        Command::Check { path: None, .. } => {
            let report = with_spinner("checking the pool", || c.check())?;
            return report_check(&report, p);
        }
        // `execute` runs these itself; reaching here would be a bug, and an
        // error says so rather than a panic.
        Command::Serve(_)
        | Command::Pool(PoolCommand::Create(_))
        | Command::Pool(PoolCommand::Grow(PoolGrowArgs { path: Some(_), .. }))
        | Command::Pool(PoolCommand::Upgrade { path: Some(_) })
        | Command::Check { path: Some(_), .. }
        | Command::Tls(_)
        | Command::Completions { .. }
        | Command::Manpages { .. } => {
            anyhow::bail!("internal error: this command does not go through the daemon")
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `arbor send`: the stream to a file or stdout, progress on stderr for a
/// terminal, a summary after (on stderr when the stream is on stdout).
fn send(args: &SendArgs, c: &DaemonClient, p: &Printer) -> Result<()> {
    let query = SendQuery {
        snapshot: args.snapshot.clone(),
        from: args.from.clone(),
        resume: args.resume.clone(),
        compression: match args.compression {
            CompressionArg::None => StreamCompression::None,
            CompressionArg::Zstd => StreamCompression::Zstd,
            CompressionArg::Best => StreamCompression::Best,
        },
        level: Some(args.level),
        format: stream_format(args.format),
        raw: args.raw,
    };
    let estimate = c.send_estimate(&query)?;
    if args.dry_run {
        return p.show(&estimate, output::send_estimate);
    }
    let to_stdout = args.output.as_os_str() == "-";
    if to_stdout && std::io::stdout().is_terminal() {
        return Err(Fail::new(
            Exit::Usage,
            "not writing a binary stream to a terminal: give -o FILE or pipe it".to_owned(),
        )
        .into());
    }
    let mut out: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::File::create(&args.output)
                .with_context(|| format!("cannot create {}", args.output.display()))?,
        )
    };
    let bar = byte_progress(
        estimate.stream_bytes_max,
        &format!("sending {}", estimate.snapshot),
    );
    let written = c.send_stream(&query, &mut out, &mut |n| bar.set_position(n))?;
    bar.finish_and_clear();
    drop(out);
    let summary = SendSummary {
        snapshot: estimate.snapshot,
        from: estimate.from,
        stream_bytes: written,
        data_bytes: estimate.data_bytes,
        resume_offset: estimate.resume_offset,
    };
    let text = |s: &SendSummary| {
        format!(
            "sent {}{}: {} of data in a {} stream\n",
            s.snapshot,
            s.from
                .as_ref()
                .map(|f| format!(" (from {f})"))
                .unwrap_or_default(),
            ByteSize(s.data_bytes),
            ByteSize(s.stream_bytes)
        )
    };
    if to_stdout {
        eprint!("{}", text(&summary));
        Ok(())
    } else {
        p.show(&summary, text)
    }
}

#[derive(Serialize)]
struct SendSummary {
    snapshot: String,
    from: Option<String>,
    stream_bytes: u64,
    data_bytes: u64,
    resume_offset: u64,
}

fn stream_format(arg: FormatArg) -> StreamFormat {
    match arg {
        FormatArg::Arbor => StreamFormat::Arbor,
        FormatArg::RbdDiff => StreamFormat::RbdDiff,
    }
}

/// `arbor receive`: a stream from a file or stdin into a volume; or the
/// status or abort of one in progress.
fn receive(args: &ReceiveArgs, c: &DaemonClient, p: &Printer) -> Result<()> {
    let volume = &args.volume;
    if args.status {
        return p.show(&c.receive_status(volume)?, output::receive_status);
    }
    if args.abort {
        c.receive_abort(volume)?;
        return p.done(
            "aborted",
            volume,
            format!(
                "abandoned the receive into {volume}; its space is reclaimed in the background\n"
            ),
        );
    }
    let (input, size): (Box<dyn Read + Send>, Option<u64>) = if args.input.as_os_str() == "-" {
        if std::io::stdin().is_terminal() {
            return Err(Fail::new(
                Exit::Usage,
                "no stream on stdin (a terminal): give -i FILE or pipe `arbor send` into it"
                    .to_owned(),
            )
            .into());
        }
        (Box::new(std::io::stdin()), None)
    } else {
        let file = std::fs::File::open(&args.input)
            .with_context(|| format!("cannot open {}", args.input.display()))?;
        let size = file.metadata().ok().map(|m| m.len());
        (Box::new(file), size)
    };
    if args.heal {
        if args.format != FormatArg::Arbor {
            return Err(Fail::new(
                Exit::Usage,
                "--heal takes an arbor stream (an rbd diff carries no snapshot identity)"
                    .to_owned(),
            )
            .into());
        }
        let bar = byte_progress(size.unwrap_or(0), &format!("healing {volume}"));
        let healed = c.heal_stream(volume, input, &mut |n| bar.set_position(n));
        bar.finish_and_clear();
        let healed = healed?;
        p.show(&healed, output::healed)?;
        if healed.remaining > 0 {
            return Err(Fail::new(
                Exit::Damaged,
                format!(
                    "{} blocks of {} are still damaged",
                    healed.remaining, healed.snapshot
                ),
            )
            .into());
        }
        return Ok(());
    }
    let bar = byte_progress(size.unwrap_or(0), &format!("receiving into {volume}"));
    let received = c.receive_stream(
        volume,
        args.force,
        stream_format(args.format),
        input,
        &mut |n| bar.set_position(n),
    );
    bar.finish_and_clear();
    p.show(&received?, output::received)
}

/// A byte progress bar on stderr when it is a terminal (hidden otherwise);
/// `total` 0: unknown.
fn byte_progress(total: u64, message: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = if total > 0 {
        ProgressBar::new(total)
    } else {
        ProgressBar::new_spinner()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} {bytes}/{total_bytes} {bytes_per_sec} ({elapsed}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(message.to_owned());
    bar
}

/// Runs `work` with a spinner on stderr when it is a terminal (never in
/// pipes or logs), so a long request visibly makes progress.
fn with_spinner<T>(message: &str, work: impl FnOnce() -> Result<T>) -> Result<T> {
    let spinner = ProgressBar::new_spinner().with_message(message.to_owned());
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    spinner.enable_steady_tick(Duration::from_millis(120));
    let result = work();
    spinner.finish_and_clear();
    result
}

/// Runs `work` (a request the daemon answers when a backup job ends) with
/// a progress bar of that job, read from `GET /v1/backup-jobs` by another
/// client on another thread; a spinner where none can be had.
fn with_job_progress<T>(
    c: &DaemonClient,
    job: (&str, &str, &str),
    message: &str,
    work: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Ok(watcher) = c.fork() else {
        return with_spinner(message, work);
    };
    let (kind, repository, subject) = (job.0.to_owned(), job.1.to_owned(), job.2.to_owned());
    let bar = ProgressBar::new(0).with_message(message.to_owned());
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} ({elapsed})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let poller = {
        let bar = bar.clone();
        std::thread::spawn(move || {
            tick_until_stopped(&stopped, Duration::from_millis(250), || {
                if let Ok(jobs) = watcher.backup_jobs() {
                    let mine = jobs.iter().find(|j| {
                        j.kind == kind && j.repository == repository && j.subject == subject
                    });
                    if let Some(j) = mine {
                        bar.set_length(j.total_bytes);
                        bar.set_position(j.done_bytes.min(j.total_bytes));
                    }
                }
            })
        })
    };
    let result = work();
    // The poller wakes at once: the command ends when the work does, not
    // at the poller's next tick (up to 250 ms later, on every backup and
    // restore).
    drop(stop);
    let _ = poller.join();
    bar.finish_and_clear();
    result
}

/// Runs `tick`, then again every `every`, until `stop`'s sender is dropped
/// (or sends): the wait between ticks ends at once then.
fn tick_until_stopped(
    stop: &std::sync::mpsc::Receiver<()>,
    every: Duration,
    mut tick: impl FnMut(),
) {
    loop {
        tick();
        match stop.recv_timeout(every) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Prints the report; a damaged pool is also an error on stderr (exit 8),
/// so scripts and people notice it even with `--json` on stdout.
fn report_check(report: &CheckView, p: &Printer) -> Result<ExitCode> {
    p.show(report, output::check)?;
    if report.clean {
        return Ok(ExitCode::SUCCESS);
    }
    let count = report.problems.len() + report.unlisted;
    let damaged = report.damaged.blocks.len() as u64 + report.damaged.unlisted;
    let why = if count == 0 && damaged > 0 {
        format!("data is damaged: {damaged} data blocks do not match their checksums")
    } else if count == 0 {
        format!(
            "data is lost: {} snapshots and clones read bytes lost with an origin's device",
            report.lost.len()
        )
    } else {
        format!("the pool is damaged: {count} problems found")
    };
    Err(Fail::new(Exit::Damaged, why).into())
}

fn grow_request(size: Option<ByteSize>, metadata_size: Option<ByteSize>) -> GrowRequest {
    GrowRequest {
        size,
        metadata_bytes: metadata_size,
    }
}

/// How offline commands reach a pool.
const OFFLINE_IO: IoMode = IoMode::Fixed(arbor_io::CacheMode::Buffered);

/// Runs `work` on the pool at `path`, opened and locked by this process
/// (refused while a daemon holds it), then commits and closes the pool.
fn with_offline_pool<T>(path: &Path, work: impl FnOnce(&OpenPool) -> Result<T>) -> Result<T> {
    // Offline commands are one walk and one commit: the page cache serves them well.
    let open = OpenPool::open(path, &OpenOptions::default(), OFFLINE_IO)?;
    let result = work(&open)?;
    open.close()?;
    Ok(result)
}

fn check_offline(path: &Path, repair: bool, p: &Printer) -> Result<ExitCode> {
    let repaired = if repair {
        let actions = with_spinner(&format!("repairing {}", path.display()), || {
            pool_file::repair(path, &OpenOptions::default()).map_err(anyhow::Error::from)
        })?;
        Some(actions)
    } else {
        None
    };
    let report = with_offline_pool(path, |open| {
        with_spinner(&format!("checking {}", path.display()), || {
            Ok(open.pool.check()?)
        })
    })?;
    let mut view = views::check_view(report);
    view.repaired = repaired;
    report_check(&view, p)
}

fn create_pool(args: &PoolCreateArgs, p: &Printer) -> Result<ExitCode> {
    let options = CreateOptions {
        chunk_size: match args.chunk_size {
            Some(size) => u32::try_from(size.0)
                .map_err(|_| Fail::new(Exit::Usage, format!("chunk size {size} is too large")))?,
            None => arbor_engine::DEFAULT_CHUNK_SIZE,
        },
        metadata_bytes: args.metadata_size.map(|s| s.0),
        // The argument's parser admits only the versions arbor_format knows.
        format_version: arbor_format::FormatVersion::new(args.format_version)
            .map_err(|e| Fail::new(Exit::Usage, e.to_string()))?,
        ..Default::default()
    };
    let pool = OpenPool::create(
        &args.path,
        args.size.map(|s| s.0),
        &options,
        &OpenOptions::default(),
        OFFLINE_IO,
        args.force,
    )?;
    let stats = pool.pool.pool_stats()?;
    let version = pool.pool.format_version();
    pool.close()?;
    let path = args.path.display().to_string();
    p.done(
        "created",
        &path,
        format!(
            "created pool {path}: {} of data space in {} chunks, {} of metadata space, \
             format version {}\n",
            ByteSize(stats.data_bytes),
            ByteSize(stats.chunk_size),
            ByteSize(stats.metadata_bytes),
            version,
        ),
    )?;
    Ok(ExitCode::SUCCESS)
}

fn serve(data_dir: Option<std::path::PathBuf>, args: &ServeArgs) -> Result<ExitCode> {
    let (config, text) = config::load(data_dir.clone(), &args.overrides())?;
    if args.print_config {
        emit(&text)?;
        return Ok(ExitCode::SUCCESS);
    }
    let source = arbor_daemon::ConfigSource {
        data_dir,
        overrides: args.overrides(),
    };
    arbor_daemon::serve(config, source).context("arbor serve failed")?;
    Ok(ExitCode::SUCCESS)
}

/// `arbor origin`: raw disks and image files snapshotted in place.
fn origin(command: OriginCommand, c: &DaemonClient, p: &Printer) -> Result<()> {
    match command {
        OriginCommand::Attach {
            name,
            path,
            accept_damage,
        } => {
            let path = origin_path(&path, c.is_remote())?;
            p.show(&c.attach_origin(&name, &path, accept_damage)?, |o| {
                format!(
                    "attached {path} as {name} ({}): its data stays in place; \
                     snapshot it with arbor snapshot create {name}@SNAP\n",
                    ByteSize(o.size)
                )
            })?;
        }
        OriginCommand::Detach {
            name,
            force,
            copy_to_pool,
        } => {
            c.detach_origin(&name, force, copy_to_pool)?;
            let said = if copy_to_pool {
                format!(
                    "detached {name}'s file or device, which holds the volume's current \
                     content; {name} stays in the pool with its data copied (layout cow), \
                     and its snapshots and clones with it\n"
                )
            } else {
                format!(
                    "detached {name}: its file or device holds the volume's current content, \
                     and the pool frees the copies kept for its snapshots\n"
                )
            };
            p.done("detached", &name, said)?;
        }
        OriginCommand::List => p.show(&c.origins()?, |l| output::origins(l))?,
    }
    Ok(())
}

/// The path to send for `origin attach`: absolute, since the daemon's
/// working directory is not ours (symbolic links are kept: a stable name
/// such as /dev/disk/by-id/... is what the daemon should open again at its
/// next start). A daemon reached with --api may be on another host, where
/// a relative path means nothing.
fn origin_path(path: &Path, remote: bool) -> Result<String> {
    if remote && !path.is_absolute() {
        return Err(Fail::new(
            Exit::Usage,
            format!(
                "{}: give an absolute path on the daemon's host (with --api the daemon \
                 may be on another one)",
                path.display()
            ),
        )
        .into());
    }
    let absolute = std::path::absolute(path)
        .with_context(|| format!("cannot make {} absolute", path.display()))?;
    match absolute.to_str() {
        Some(text) => Ok(text.to_owned()),
        None => Err(Fail::new(
            Exit::Usage,
            format!("{}: only UTF-8 paths can be sent", absolute.display()),
        )
        .into()),
    }
}

fn policy(command: PolicyCommand, c: &DaemonClient, p: &Printer) -> Result<()> {
    match command {
        PolicyCommand::Set {
            volume,
            with,
            schedule,
            keep,
            prefix,
            warn_age,
            crit_age,
            space_prune,
        } => {
            let request = PolicyRequest {
                with,
                schedule,
                retention: keep,
                prefix: Some(prefix),
                warn_age_secs: warn_age.map(|d| d.as_secs()),
                crit_age_secs: crit_age.map(|d| d.as_secs()),
                space_prune_percent: space_prune,
            };
            p.show(&c.policy_set(&volume, &request)?, |v| {
                output::policies(std::slice::from_ref(v), arbor_daemon::unix_now())
            })?;
        }
        PolicyCommand::Show { volume } => {
            let list = match &volume {
                Some(v) => vec![c.policy(v)?],
                None => c.policies()?,
            };
            p.show(&list, |l| output::policies(l, arbor_daemon::unix_now()))?;
        }
        PolicyCommand::Clear { volume } => {
            c.policy_clear(&volume)?;
            p.done(
                "cleared",
                &volume,
                format!("{volume} has no policy now; the snapshots it made stay\n"),
            )?;
        }
    }
    Ok(())
}

/// What `arbor backup init` made.
#[derive(Serialize)]
pub struct BackupInitView {
    pub url: String,
    pub id: String,
    pub block_size: u32,
}

fn backup_init(args: &BackupInitArgs) -> Result<BackupInitView> {
    use arbor_backup::spec::{KeyFile, RepoSpec};
    let key = match (&args.key_file, &args.passphrase_file) {
        (Some(k), None) => KeyFile::Key(k.clone()),
        (None, Some(p)) => KeyFile::Passphrase(p.clone()),
        _ => anyhow::bail!(crate::exit::usage(
            "give one of --key-file and --passphrase-file"
        )),
    };
    let block_size = u32::try_from(args.block_size.0).map_err(|_| {
        crate::exit::usage(format!("--block-size {} is too large", args.block_size))
    })?;
    let spec = RepoSpec {
        url: args.url.clone(),
        endpoint: args.endpoint.clone(),
        region: args.region.clone(),
        credentials_file: args.credentials_file.clone(),
        key,
        upload_rate: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a runtime")?;
    let repo = runtime
        .block_on(spec.init(block_size))
        .map_err(|e| crate::exit::backup_error(e, &args.url))?;
    Ok(BackupInitView {
        url: repo.location().to_string(),
        id: repo.id().to_owned(),
        block_size: repo.block_size(),
    })
}

fn backup(command: BackupCommand, c: &DaemonClient, p: &Printer) -> Result<()> {
    match command {
        BackupCommand::Repositories => p.show(&c.backup_repositories()?, |l| {
            output::backup_repositories(l)
        })?,
        BackupCommand::Create {
            repository,
            snapshot,
        } => {
            let message = format!("backing up {snapshot} to {repository}");
            let job = ("backup", repository.as_str(), snapshot.as_str());
            let made = with_job_progress(c, job, &message, || {
                c.backup_create(
                    &repository,
                    &BackupRequest {
                        snapshot: snapshot.clone(),
                    },
                )
            })?;
            p.show(&made, output::backup_made)?;
        }
        BackupCommand::Verify { repository, sample } => {
            let v = with_spinner(&format!("verifying {repository}"), || {
                c.backup_verify(
                    &repository,
                    &VerifyRequest {
                        sample_percent: Some(sample),
                    },
                )
            })?;
            p.show(&v, output::backup_verified)?;
            if v.problem_count > 0 {
                return Err(Fail::new(
                    Exit::Damaged,
                    format!("{repository}: {} problems found", v.problem_count),
                )
                .into());
            }
        }
        BackupCommand::Jobs => p.show(&c.backup_jobs()?, |l| output::backup_jobs(l))?,
        BackupCommand::List { repository } => {
            p.show(&c.backups(&repository)?, output::backup_list)?
        }
        BackupCommand::Prune {
            repository,
            keep,
            dry_run,
            repack_unused,
        } => {
            let what = if dry_run {
                "planning a prune of"
            } else {
                "pruning"
            };
            let pruned = with_spinner(&format!("{what} {repository}"), || {
                c.backup_prune(
                    &repository,
                    &BackupPruneRequest {
                        keep: keep.clone(),
                        dry_run,
                        repack_unused_percent: Some(repack_unused),
                    },
                )
            })?;
            p.show(&pruned, output::backup_pruned)?;
        }
        BackupCommand::Restore {
            repository,
            backup,
            volume,
            instant: true,
        } => {
            let restored = c.backup_restore(
                &repository,
                &RestoreRequest {
                    backup,
                    volume,
                    instant: true,
                },
            )?;
            p.show(&restored, output::backup_restored)?;
        }
        BackupCommand::Restore {
            repository,
            backup,
            volume,
            instant: false,
        } => {
            let message = format!("restoring {backup} into {volume}");
            let job = ("restore", repository.as_str(), volume.as_str());
            let restored = with_job_progress(c, job, &message, || {
                c.backup_restore(
                    &repository,
                    &RestoreRequest {
                        backup: backup.clone(),
                        volume: volume.clone(),
                        instant: false,
                    },
                )
            })?;
            p.show(&restored, output::backup_restored)?;
        }
        BackupCommand::NewKey { .. } | BackupCommand::Init(_) => {
            anyhow::bail!("internal error: this command does not go through the daemon")
        }
    }
    Ok(())
}

fn replica(command: ReplicaCommand, c: &DaemonClient, p: &Printer) -> Result<()> {
    match command {
        ReplicaCommand::Add {
            volume,
            target,
            rate_limit,
            interval,
            keep,
            identity,
            seeded,
        } => {
            let (target, remote_volume) = match target.split_once('/') {
                Some((t, v)) => (t.to_owned(), Some(v.to_owned())),
                None => (target, None),
            };
            let request = ReplicaAddRequest {
                volume: volume.clone(),
                target: target.clone(),
                remote_volume,
                identity,
                rate_limit: rate_limit.map(|r| r.0),
                interval_secs: Some(interval.as_secs()),
                keep,
                seeded,
            };
            p.show(&c.replica_add(&request)?, |_| {
                format!("replicating {volume} to {target}: the first cycle runs now (arbor replica status)\n")
            })?;
        }
        ReplicaCommand::Remove { volume, target } => {
            c.replica_remove(&volume, target.as_deref())?;
            let to = target.map(|t| format!(" to {t}")).unwrap_or_default();
            p.done(
                "unreplicated",
                &volume,
                format!("{volume} is no longer replicated{to}\n"),
            )?;
        }
        ReplicaCommand::Status => p.show(&c.replicas()?, output::replicas)?,
        ReplicaCommand::Run { volume, target } => p.show(
            &c.replica_run(&volume, target.as_deref(), false)?,
            output::replica_runs,
        )?,
        ReplicaCommand::Resync {
            volume,
            target,
            force,
        } => {
            if !force {
                bail!(Fail::new(
                    Exit::Usage,
                    format!("a resync deletes the target's own snapshots of {volume} and its writes since the newest common snapshot: give --force")
                ));
            }
            p.show(
                &c.replica_run(&volume, target.as_deref(), true)?,
                output::replica_runs,
            )?
        }
        ReplicaCommand::Promote { volume } => {
            let role = c.replica_promote(&volume)?;
            p.show(&role, |r| {
                format!(
                    "{volume} is now writable here (it was a replica of {})\n",
                    r.source.as_deref().unwrap_or("no source yet")
                )
            })?;
        }
        ReplicaCommand::Demote { volume, dry_run } => {
            let view = c.replica_demote(&volume, dry_run)?;
            p.show(&view, output::demote)?;
        }
    }
    Ok(())
}

/// `arbor token`: the secret of a new token goes alone to stdout (so
/// `arbor token create ci --scope read > ci.token` makes a token file),
/// what it is to stderr; with `--json`, both as one object on stdout.
fn token(command: TokenCommand, c: &DaemonClient, p: &Printer) -> Result<()> {
    match command {
        TokenCommand::Create {
            name,
            scope,
            expires,
        } => {
            let request = TokenRequest {
                name,
                scope,
                expires_in_secs: expires.map(|d| d.as_secs().max(1)),
            };
            let created = c.token_create(&request)?;
            if !p.json {
                let t = &created.token;
                let expiry = match t.expires_unix_secs {
                    Some(at) => format!(
                        "expires {}",
                        humantime::format_rfc3339_seconds(
                            std::time::UNIX_EPOCH + Duration::from_secs(at),
                        )
                    ),
                    None => "never expires".to_owned(),
                };
                eprintln!(
                    "created token {} (scope {}, {expiry}); it is shown once, below: store it \
                     now (e.g. in a file of mode 0600 for --token-file)",
                    t.name,
                    t.scope.name()
                );
            }
            p.show(&created, |c| format!("{}\n", c.secret))?;
        }
        TokenCommand::List => p.show(&c.tokens()?, |l| output::tokens(l))?,
        TokenCommand::Revoke { name } => {
            c.token_revoke(&name)?;
            p.done(
                "revoked",
                &name,
                format!("revoked token {name}: it stops working at once\n"),
            )?;
        }
    }
    Ok(())
}

/// What `--deferred` asks of a snapshot or clone.
fn durability(deferred: bool) -> Durability {
    if deferred {
        Durability::Deferred
    } else {
        Durability::Committed
    }
}

/// Writes the man page of `command` (named `arbor`, or `arbor-SUB-...`
/// for a subcommand) and of each of its subcommands into `dir`; returns
/// how many.
fn write_manpages(command: clap::Command, dir: &std::path::Path) -> Result<usize> {
    let command = command.disable_help_subcommand(true);
    let name = command.get_name().to_owned();
    // How it is typed: `arbor volume create`.
    let typed = command.get_bin_name().unwrap_or(&name).to_owned();
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone())
        .render(&mut page)
        .with_context(|| format!("cannot render the man page of {name}"))?;
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    let mut written = 1;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub = sub
            .clone()
            .version(env!("CARGO_PKG_VERSION"))
            .bin_name(format!("{typed} {}", sub.get_name()))
            .name(format!("{name}-{}", sub.get_name()));
        written += write_manpages(sub, dir)?;
    }
    Ok(written)
}

/// `key new` and `backup new-key`: a new key file at `file`.
fn new_key(printer: &Printer, file: &Path, what: &str, without: &str) -> Result<ExitCode> {
    arbor_backup::spec::new_key_file(file)?;
    printer.done(
        "new-key",
        &file.display().to_string(),
        format!(
            "wrote {what} to {}: keep a copy off this host, {without} without it\n",
            file.display()
        ),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// The user's key that `key` names, read here (the daemon gets its bytes,
/// never the file's path) as backup keys are (`arbor_backup::spec`): a
/// file its owner alone may read, bounded. A key file holds 32 bytes (sent
/// as hex) or 64 hex digits (checked by the daemon); a passphrase is the
/// first line of its file, or of standard input for `-`.
fn user_key(key: &crate::cli::KeyArgs) -> Result<arbor_api::model::KeyMaterial> {
    use arbor_api::model::KeyMaterial;
    use arbor_daemon::keys::{key_file_material, passphrase_file_material};
    // An unreadable or unsafe key file fails the command (exit 1).
    let invalid = |e: arbor_daemon::error::DaemonError| anyhow::anyhow!("{e}");
    match (&key.key_file, &key.passphrase_file) {
        // A raw key piped in (from a key management service's tool).
        (Some(path), None) if path == Path::new("-") => {
            use std::io::Read;
            let mut bytes = zeroize::Zeroizing::new(Vec::new());
            std::io::stdin()
                .take(4097)
                .read_to_end(&mut bytes)
                .context("cannot read the key from standard input")?;
            if bytes.len() > 4096 {
                anyhow::bail!("the key on standard input is longer than 4096 bytes");
            }
            Ok(arbor_daemon::keys::raw_key_material(&bytes, "standard input").map_err(invalid)?)
        }
        (Some(path), None) => Ok(key_file_material(path).map_err(invalid)?),
        (None, Some(path)) if path == Path::new("-") => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("cannot read the passphrase from standard input")?;
            Ok(KeyMaterial::Passphrase {
                passphrase: line.trim_end_matches(['\n', '\r']).to_owned(),
            })
        }
        (None, Some(path)) => Ok(passphrase_file_material(path).map_err(invalid)?),
        _ => Err(Fail::new(
            Exit::Usage,
            "give the key: --key-file FILE or --passphrase-file FILE".to_owned(),
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poller told to stop returns without waiting out its interval
    /// (an hour here: a wait would hang the test), after the one tick it
    /// makes first; and one not told goes on ticking.
    #[test]
    fn a_poller_stops_at_once_when_told() {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        drop(stop);
        let mut ticks = 0;
        tick_until_stopped(&stopped, Duration::from_secs(3600), || ticks += 1);
        assert_eq!(ticks, 1);

        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let mut stop = Some(stop);
        let mut ticks = 0;
        tick_until_stopped(&stopped, Duration::from_millis(1), || {
            ticks += 1;
            if ticks == 3 {
                stop.take();
            }
        });
        assert_eq!(ticks, 3);
    }
}
