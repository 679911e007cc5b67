//! Power-cut campaign by record and replay; see `arbor_campaigns::powercut`
//! and docs/RELIABILITY.md.
//!
//! cargo run --release -p arbor-campaigns --bin powercut -- --seconds 900

use std::process::ExitCode;

use arbor_campaigns::powercut::{run, Config};
use arbor_campaigns::{cut_progress, exit_code, repeat, RunArgs, Tally};
use clap::Parser;

#[derive(Parser)]
#[command(
    about = "Record a random workload, cut power at many points of it, verify every crash image"
)]
struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// Operations per workload.
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Crash images per cut point with unflushed writes.
    #[arg(long, default_value_t = 4)]
    variants: usize,
    /// Chance (percent) of a cut at an event not next to a flush.
    #[arg(long, default_value_t = 5)]
    random_cut_percent: u32,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (total, runs, elapsed) = repeat(
        &args.run,
        |seed| {
            run(Config {
                steps: args.steps,
                variants: args.variants,
                random_cut_percent: args.random_cut_percent,
                ..Config::new(seed)
            })
        },
        |t, runs, elapsed| cut_progress(runs, elapsed, t.cut_points, t.images, t.failures().len()),
    );
    println!(
        "powercut: {runs} runs (seeds {}..{}), {} operations, {} device events ({} flushes, {} intent log records; {} snapshots logged), {} cut points, {} crash images verified, {} failures, {:.0} s",
        args.run.seed,
        args.run.seed + runs,
        total.steps,
        total.events,
        total.flushes,
        total.durable_writes,
        total.logged_snapshots,
        total.cut_points,
        total.images,
        total.failures.len(),
        elapsed.as_secs_f64()
    );
    exit_code(&total)
}
