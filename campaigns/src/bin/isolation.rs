//! Isolation campaign; see `arbor_campaigns::isolation` and docs/RELIABILITY.md.
//!
//! cargo run --release -p arbor-campaigns --bin isolation -- --seconds 300

use std::process::ExitCode;

use arbor_campaigns::isolation::run;
use arbor_campaigns::{cut_progress, exit_code, repeat, RunArgs, Tally};
use clap::Parser;

#[derive(Parser)]
#[command(
    about = "Delete a volume of secret data; reclaim, reuse and cut power; no volume may ever read the secret"
)]
struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// Operations after the delete, per run.
    #[arg(long, default_value_t = 150)]
    steps: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (total, runs, elapsed) = repeat(
        &args.run,
        |seed| run(seed, args.steps),
        |t, runs, elapsed| cut_progress(runs, elapsed, t.cut_points, t.images, t.failures().len()),
    );
    println!(
        "isolation: {runs} runs (seeds {}..{}), {} operations, {} cut points, {} crash images, {} sectors scanned, {} failures, {:.0} s",
        args.run.seed,
        args.run.seed + runs,
        total.steps,
        total.cut_points,
        total.images,
        total.sectors_scanned,
        total.failures.len(),
        elapsed.as_secs_f64()
    );
    exit_code(&total)
}
