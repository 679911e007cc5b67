//! Writes a fuzz target's seed inputs into a corpus directory (used by
//! `fuzz/run.sh`): `fuzz-seeds TARGET DIR`.

use std::process::ExitCode;

use arbor_campaigns::hostile::TARGETS;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, dir] = args.as_slice() else {
        eprintln!("usage: fuzz-seeds TARGET DIR");
        return ExitCode::FAILURE;
    };
    let Some(target) = TARGETS.iter().find(|t| t.name == name) else {
        eprintln!("unknown target {name}");
        return ExitCode::FAILURE;
    };
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        (target.seeds)()
            .iter()
            .enumerate()
            .try_for_each(|(i, seed)| std::fs::write(format!("{dir}/seed-{i}"), seed))
    });
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("writing seeds to {dir}: {e}");
            ExitCode::FAILURE
        }
    }
}
