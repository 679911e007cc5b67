//! Two-device campaign; see `arbor_campaigns::origin` and docs/RELIABILITY.md.
//!
//! cargo run --release -p arbor-campaigns --bin origin -- --seconds 600

use std::process::ExitCode;

use arbor_campaigns::origin::run;
use arbor_campaigns::{exit_code, progress, repeat, RunArgs, Tally};
use clap::Parser;

#[derive(Parser)]
#[command(
    about = "A copy-on-write volume's device and the pool lose power independently, in a pool that keeps running out: snapshots keep their point in time, the device is never touched by a write that found no room"
)]
struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// Operations per run.
    #[arg(long, default_value_t = 600)]
    steps: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (total, runs, elapsed) = repeat(
        &args.run,
        |seed| run(seed, args.steps),
        |t, runs, elapsed| {
            let counts = format!("{} operations, {} cuts", t.operations, t.cuts);
            progress(runs, elapsed, &counts, t.failures().len())
        },
    );
    println!(
        "origin: {runs} runs (seeds {}..{}), {} operations, {} power cuts recovered and checked, {} writes found no data space and {} no metadata (device checked untouched), {} interrupted rollbacks finished, {} growths ({} more cut part way), {} failures, {:.0} s",
        args.run.seed,
        args.run.seed + runs,
        total.operations,
        total.cuts,
        total.ran_out_data,
        total.ran_out_metadata,
        total.rollbacks_resumed,
        total.growths,
        total.growths_cut,
        total.failures.len(),
        elapsed.as_secs_f64()
    );
    exit_code(&total)
}
