//! Exhaustion campaign; see `arbor_campaigns::exhaustion` and docs/RELIABILITY.md.
//!
//! cargo run --release -p arbor-campaigns --bin exhaustion -- --seconds 600

use std::process::ExitCode;

use arbor_campaigns::exhaustion::run;
use arbor_campaigns::{exit_code, progress, repeat, RunArgs, Tally};
use clap::Parser;

#[derive(Parser)]
#[command(
    about = "Every public operation on a pool whose data, metadata and journal are tiny: a failed operation leaves no trace"
)]
struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// Operations per run.
    #[arg(long, default_value_t = 400)]
    steps: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (total, runs, elapsed) = repeat(
        &args.run,
        |seed| run(seed, args.steps),
        |t, runs, elapsed| {
            let counts = format!(
                "{} operations, {} ran out of space",
                t.operations, t.resource_failures
            );
            progress(runs, elapsed, &counts, t.failures().len())
        },
    );
    println!(
        "exhaustion: {runs} runs (seeds {}..{}), {} operations, {} failed for lack of space ({}), {} commits checked, {} reopens, {} power cuts, {} concurrent writes ({} ran out), {} raced shrinks, {} online growths, {} units split for journal room, chunk writes ({}), {} failures, {:.0} s",
        args.run.seed,
        args.run.seed + runs,
        total.operations,
        total.resource_failures,
        total.ran_out_summary(),
        total.commits_checked,
        total.reopens,
        total.power_cuts,
        total.writer_ops,
        total.writer_ran_out,
        total.resize_races,
        total.growths,
        total.split_units,
        total
            .chunk_writes
            .named()
            .map(|(plan, n)| format!("{plan} {n}"))
            .join(", "),
        total.failures.len(),
        elapsed.as_secs_f64()
    );
    exit_code(&total)
}
