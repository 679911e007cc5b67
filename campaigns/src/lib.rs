//! arbor's reliability campaigns (docs/RELIABILITY.md). Each campaign is a
//! library function run two ways: briefly by `cargo test -p arbor-campaigns`
//! (CI) and for as long as wanted by its binary (`src/bin/`).

pub mod corruption;
pub mod cut;
pub mod exhaustion;
pub mod hostile;
pub mod isolation;
pub mod origin;
pub mod powercut;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arbor_engine::{CreateOptions, OpenOptions, Pool};
use arbor_io::{BlockDevice, SimDisk};

pub const MIB: u64 = 1 << 20;

/// Small pools: small chunks exercise many chunks and tree levels cheaply.
pub fn small_create_opts(chunk: u32) -> CreateOptions {
    CreateOptions {
        chunk_size: chunk,
        metadata_bytes: Some(4 * MIB),
        ..Default::default()
    }
}

/// A small cache, so nodes and space-map pages are evicted and re-read often.
pub fn small_open_opts() -> OpenOptions {
    OpenOptions {
        cache_bytes: 256 << 10,
        dirty_node_limit: 512,
    }
}

/// The key of an encrypted run: its slot, and the user's key that opens
/// the record the pool keeps there.
#[derive(Clone)]
pub struct RunKey {
    pub slot: u64,
    user: Arc<arbor_crypt::UserKey>,
}

impl RunKey {
    /// A new data key (512-byte units) in a slot of `pool`'s key store,
    /// loaded.
    pub fn create(pool: &Pool) -> Result<Self, String> {
        use arbor_crypt::{DataUnit, Kdf, KeyRecord, UserKey, VolumeCipher};
        let user = UserKey::generate_raw();
        let (record, data_key) = KeyRecord::create(&user, DataUnit::B512, Kdf::PASSPHRASE_DEFAULT)
            .map_err(|e| e.to_string())?;
        let cipher =
            VolumeCipher::new(data_key, record.key_id, record.unit).map_err(|e| e.to_string())?;
        let slot = pool
            .add_key_record(record)
            .map_err(|e| e.to_string())?
            .slot();
        pool.load_key(slot, cipher).map_err(|e| e.to_string())?;
        Ok(Self {
            slot,
            user: Arc::new(user),
        })
    }

    /// Loads the key into a pool opened from a crash image: the record
    /// from the image's own key store.
    pub fn load(&self, pool: &Pool) -> Result<(), String> {
        let record = pool
            .key_record(self.slot)
            .map_err(|e| format!("key store: {e}"))?
            .ok_or("the key store lost the run's key")?;
        let data_key = record
            .unwrap_key(&self.user)
            .map_err(|e| format!("key: {e}"))?;
        let cipher = arbor_crypt::VolumeCipher::new(data_key, record.key_id, record.unit)
            .map_err(|e| e.to_string())?;
        pool.load_key(self.slot, cipher).map_err(|e| e.to_string())
    }
}

/// Opens a pool on an in-memory copy of `image`.
pub fn open_image(image: Vec<u8>) -> arbor_engine::Result<Pool> {
    let dev: Arc<dyn BlockDevice> = Arc::new(SimDisk::from_image(image));
    Pool::open(dev, &small_open_opts())
}

/// Runs `f` and turns a panic into an error message (campaigns count panics
/// as failures and go on).
pub fn no_panic<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "(non-string panic)".into());
            Err(format!("panic: {message}"))
        }
    }
}

/// When a by-hand run stops, and where its seeds start.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Start no new run after this many seconds.
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Stop after this many runs (without --seconds: one run).
    #[arg(long)]
    pub runs: Option<u64>,
    /// Seed of the first run; run i uses seed + i.
    #[arg(long, default_value_t = 1000)]
    pub seed: u64,
}

/// What a campaign's runs add up to.
pub trait Tally: Default {
    fn add(&mut self, other: Self);
    fn failures(&self) -> &[String];
}

/// Runs `one(seed)` for seeds from `args.seed` on, until the budget is spent;
/// prints every failure as it comes and `progress` every ten runs.
pub fn repeat<T: Tally>(
    args: &RunArgs,
    mut one: impl FnMut(u64) -> T,
    progress: impl Fn(&T, u64, Duration),
) -> (T, u64, Duration) {
    let started = Instant::now();
    let limit = args.seconds.map(Duration::from_secs);
    let mut total = T::default();
    let mut runs = 0;
    loop {
        let by_runs = args.runs.map_or(runs == 0 || limit.is_some(), |n| runs < n);
        let by_time = limit.is_none_or(|d| started.elapsed() < d);
        if !(by_runs && by_time) {
            break;
        }
        let outcome = one(args.seed + runs);
        for failure in outcome.failures() {
            println!("FAIL {failure}");
        }
        total.add(outcome);
        runs += 1;
        if runs.is_multiple_of(10) {
            progress(&total, runs, started.elapsed());
        }
    }
    (total, runs, started.elapsed())
}

/// The exit status of a campaign binary.
pub fn exit_code<T: Tally>(total: &T) -> std::process::ExitCode {
    if total.failures().is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// The progress line of a campaign: `counts` says what its runs did.
pub fn progress(runs: u64, elapsed: Duration, counts: &str, failures: usize) {
    eprintln!(
        "{:>6.0}s: {runs} runs, {counts}, {failures} failures",
        elapsed.as_secs_f64()
    );
}

/// The progress line of the campaigns that cut power.
pub fn cut_progress(runs: u64, elapsed: Duration, cut_points: u64, images: u64, failures: usize) {
    eprintln!(
        "{:>6.0}s: {runs} runs, {cut_points} cut points, {images} images, {failures} failures",
        elapsed.as_secs_f64()
    );
}
