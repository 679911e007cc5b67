//! Power-cut campaign by record and replay; see `arbor_campaigns::powercut`
//! and docs/RELIABILITY.md.
//!
//! cargo run --release -p arbor-campaigns --bin powercut -- --seconds 900

use std::process::ExitCode;

use arbor_campaigns::powercut::{run, Config, Outcome};
use arbor_campaigns::Budget;
use clap::Parser;

#[derive(Parser)]
#[command(
    about = "Record a random workload, cut power at many points of it, verify every crash image"
)]
struct Args {
    /// Stop starting new runs after this many seconds.
    #[arg(long)]
    seconds: Option<u64>,
    /// Stop after this many runs (one workload each).
    #[arg(long)]
    runs: Option<u64>,
    /// Seed of the first run; run i uses seed + i.
    #[arg(long, default_value_t = 1000)]
    seed: u64,
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
    let budget = Budget::new(args.runs, args.seconds);
    let mut total = Outcome::default();
    let mut i = 0;
    while budget.more(i) {
        let cfg = Config {
            steps: args.steps,
            variants: args.variants,
            random_cut_percent: args.random_cut_percent,
            ..Config::new(args.seed + i)
        };
        let outcome = run(cfg);
        for failure in &outcome.failures {
            println!("FAIL {failure}");
        }
        total.add(outcome);
        i += 1;
        if i.is_multiple_of(10) {
            eprintln!(
                "{:>6.0}s: {} runs, {} cut points, {} images, {} failures",
                budget.elapsed().as_secs_f64(),
                total.runs,
                total.cut_points,
                total.images,
                total.failures.len()
            );
        }
    }
    println!(
        "powercut: {} runs (seeds {}..{}), {} operations, {} device events ({} flushes), {} cut points, {} crash images verified, {} failures, {:.0} s",
        total.runs,
        args.seed,
        args.seed + total.runs,
        total.steps,
        total.events,
        total.flushes,
        total.cut_points,
        total.images,
        total.failures.len(),
        budget.elapsed().as_secs_f64()
    );
    if total.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
