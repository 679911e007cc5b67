//! Corruption campaign; see `arbor_campaigns::corruption` and docs/RELIABILITY.md.
//!
//! cargo run --release -p arbor-campaigns --bin corruption -- --seconds 300

use std::process::ExitCode;

use arbor_campaigns::corruption::run;
use arbor_campaigns::{exit_code, repeat, RunArgs, Tally};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Damage one structure of a rich pool at a time; check detection, reads, repair")]
struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// Trials per (structure, kind of damage) pair and pool.
    #[arg(long, default_value_t = 10)]
    trials: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (total, runs, elapsed) = repeat(
        &args.run,
        |seed| run(seed, args.trials),
        |t, runs, elapsed| {
            eprintln!(
                "{:>6.0}s: {runs} pools, {} damaged images, {} failures",
                elapsed.as_secs_f64(),
                t.trials(),
                t.failures().len()
            )
        },
    );
    println!(
        "| version | structure | damage | trials | open refused | healed on open | check reported | reads failed (error) | repaired | repair refused |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for ((version, target, damage), t) in &total.tallies {
        println!(
            "| {version} | {target:?} | {damage:?} | {} | {} | {} | {} | {} | {} | {} |",
            t.trials, t.refused, t.healed, t.detected, t.failed_reads, t.repaired, t.repair_refused
        );
    }
    println!(
        "corruption: {runs} pools (seeds {}..{}), {} damaged images, {} failures, {:.0} s",
        args.run.seed,
        args.run.seed + runs,
        total.trials(),
        total.failures.len(),
        elapsed.as_secs_f64()
    );
    exit_code(&total)
}
