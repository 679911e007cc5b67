//! The volume monitor (docs/MONITOR.md): each tick, every policy kept in
//! the pool takes its scheduled snapshot when due (one group snapshot of
//! all its volumes, in one commit) and prunes by its retention; then the
//! alerts are refreshed. Policies are read from the pool each tick, so the
//! pool alone says what is scheduled; what the monitor keeps in memory is
//! only how runs went (failures, last prune) and the active alerts.
//!
//! What a policy's turn does is `arbor_monitor::tick`'s plan; this module
//! carries it out against the pool (the group snapshot, the destroys, with
//! what keeps a snapshot in use here counted as a hold) and keeps how it
//! went.
//!
//! Every run, prune and policy change holds one lock, so a prune never
//! races a snapshot or another prune. Everything here blocks on the pool:
//! callers run it off the async workers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::Result;
use arbor_engine::{Error as EngineError, Pool, VolumeId};
use arbor_monitor::engine::{self as store, Listing, Stored};
use arbor_monitor::tick::{self, SnapshotRefusal, Usage, VolumeOutcome, VolumePlan};
use arbor_monitor::{Decision, Policy, Reason, Retention, Schedule};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::alerts::{self, Book, Condition, SpacePruned, CRITICAL_FAILURES};
pub use crate::clock::unix_now;
use crate::clock::TICK;
use crate::destroy::Destroyer;
use crate::error::DaemonError;
use crate::in_use::InUse;
use crate::replication::Replication;
use crate::scrub::Scrub;
use crate::space::SpaceWatch;
use arbor_api::model::{
    AlertKind, AlertView, PolicyRequest, PolicyView, PruneDecisionView, PruneFailureView,
    PruneRequest, PruneView, PruneVolumeView, Severity,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain bookkeeping behind, still
    // usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a policy's runs went (in memory: the schedule itself needs none).
#[derive(Debug, Default, Clone)]
struct RunState {
    last_prune: Option<u64>,
    last_pruned: u64,
    /// Snapshots or prunes that failed in a row, and the last error.
    failures: u32,
    last_error: Option<String>,
    /// What prunes destroyed beyond retention, to free space, since the
    /// pool went past the policy's space threshold.
    space_pruned: SpacePruned,
}

/// The monitor's state and what it acts on; one per daemon.
pub struct Monitor {
    runs: Mutex<HashMap<String, RunState>>,
    alerts: Mutex<Book>,
    /// One run, prune or policy change at a time.
    exclusive: Mutex<()>,
    pool: Arc<Pool>,
    /// Which volumes are replicas (no policy runs on them), and which
    /// replicate a scheduled snapshot at once.
    replication: Arc<Replication>,
    space: SpaceWatch,
    /// What keeps a snapshot from being pruned.
    in_use: InUse,
    /// A prune's destroy, as `arbor destroy`'s.
    destroyer: Destroyer,
    /// The scrub: its failure and a damaged schedule are alerts.
    scrub: Arc<Scrub>,
    /// Scheduled backups: failed and overdue ones are alerts.
    backups: Arc<crate::backups::Backups>,
}

fn invalid(message: String) -> DaemonError {
    EngineError::invalid_request(message).into()
}

/// What one policy's turn of a tick did.
#[derive(Debug, Default)]
struct Turn {
    /// The scheduled snapshot taken (its name after `@`), or why it failed.
    taken: Option<Result<String, EngineError>>,
    /// The prune, if one was due.
    pruned: Option<Vec<VolumeOutcome>>,
}

/// A due snapshot the plan could not name, as the engine's refusal.
fn refused_snapshot(refusal: SnapshotRefusal) -> EngineError {
    match refusal {
        SnapshotRefusal::NoVolume => EngineError::not_found("none of the policy's volumes exists"),
        SnapshotRefusal::NamesTaken(name) => {
            EngineError::conflict(format!("every name for a snapshot at {name} is taken"))
        }
    }
}

/// The policy of `volume` among `loaded`, if any.
fn policy_of(loaded: &[Stored], volume: VolumeId) -> Option<&Stored> {
    loaded.iter().find(|s| s.policy.volumes.contains(&volume.0))
}

fn decision_view(d: &Decision) -> PruneDecisionView {
    PruneDecisionView {
        name: d.name.clone(),
        created_unix_secs: d.created,
        reason: d.reason.to_string(),
        frees_bytes: d.frees,
    }
}

impl Monitor {
    pub fn new(
        pool: Arc<Pool>,
        replication: Arc<Replication>,
        space: SpaceWatch,
        in_use: InUse,
        destroyer: Destroyer,
        scrub: Arc<Scrub>,
        backups: Arc<crate::backups::Backups>,
    ) -> Self {
        Self {
            runs: Mutex::default(),
            alerts: Mutex::default(),
            exclusive: Mutex::default(),
            pool,
            replication,
            space,
            in_use,
            destroyer,
            scrub,
            backups,
        }
    }

    /// The backups (their jobs and schedules), whose alerts this raises.
    pub fn backups(&self) -> &crate::backups::Backups {
        &self.backups
    }

    /// The pool: what name suggestions look in.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Runs the monitor until `stop`: a tick a second, off the async
    /// workers. A tick that fails is logged and counted in its policy's
    /// state; the daemon goes on.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> Result<()> {
        let mut ticks = crate::clock::ticker(TICK);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            let monitor = Arc::clone(&self);
            let ticked = tokio::task::spawn_blocking(move || monitor.tick(unix_now())).await;
            match ticked {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.stops_pool() => return Err(e.context("the monitor stopped")),
                Ok(Err(e)) => warn!(error = e.chain(), "monitor tick failed"),
                Err(e) => error!(error = %e, "monitor tick panicked"),
            }
        }
    }

    /// One tick at `now`: every due snapshot, every due prune, the alerts.
    pub fn tick(&self, now: u64) -> Result<()> {
        let _one = lock(&self.exclusive);
        let loaded = store::load(&self.pool)?;
        for (key, why) in &loaded.damaged {
            self.failed(key, format!("the stored policy is damaged: {why}"));
        }
        let listing = Listing::of(&self.pool)?;
        for stored in &loaded.policies {
            let Some(stored) = self.drop_destroyed(stored, &listing)? else {
                continue;
            };
            if let Some(replica) = listing
                .members(&stored.policy)
                .into_iter()
                .find(|v| self.replication.is_replica(&v.name))
            {
                self.failed(
                    &stored.key,
                    format!(
                        "{} is a replica: its snapshots come from its source; clear its policy \
                         or promote it",
                        replica.name
                    ),
                );
                continue;
            }
            let last_prune = lock(&self.runs).get(&stored.key).and_then(|r| r.last_prune);
            let turn = match self.turn(&stored.policy, now, last_prune) {
                Ok(turn) => turn,
                Err(e) if e.stops_pool() => return Err(e.into()),
                Err(e) => {
                    self.failed(&stored.key, format!("policy run failed: {e}"));
                    continue;
                }
            };
            if turn.taken.is_none() && turn.pruned.is_none() {
                // Nothing ran: how the last run went still stands.
                continue;
            }
            let snapshot_error = match turn.taken {
                Some(Ok(snap)) => {
                    info!(policy = %stored.key, snapshot = %snap, "scheduled snapshot");
                    // Replicated volumes send it now, not at their pairs'
                    // next interval.
                    for volume in listing.members(&stored.policy) {
                        self.replication.pass_on(&volume.name);
                    }
                    None
                }
                Some(Err(e)) => Some(format!("scheduled snapshot failed: {e}")),
                None => None,
            };
            self.record(&stored.key, turn.pruned.as_deref(), snapshot_error, now);
        }
        let listing = Listing::of(&self.pool)?;
        self.refresh_alerts(&loaded.policies, &listing, now)
    }

    /// The stored policy without its destroyed volumes (updated in the pool;
    /// removed when none is left, which is `None`).
    fn drop_destroyed(&self, stored: &Stored, listing: &Listing) -> Result<Option<Stored>> {
        let alive: Vec<u64> = stored
            .policy
            .volumes
            .iter()
            .copied()
            .filter(|&id| listing.volume(id).is_some())
            .collect();
        if alive.len() == stored.policy.volumes.len() {
            return Ok(Some(stored.clone()));
        }
        if alive.is_empty() {
            store::remove(&self.pool, &stored.key)?;
            lock(&self.runs).remove(&stored.key);
            info!(policy = %stored.key, "policy removed: all its volumes were destroyed");
            return Ok(None);
        }
        let policy = Policy {
            volumes: alive,
            ..stored.policy.clone()
        };
        store::store(&self.pool, &stored.key, &policy)?;
        info!(policy = %stored.key, "destroyed volumes left the policy");
        Ok(Some(Stored {
            key: stored.key.clone(),
            policy,
        }))
    }

    fn failed(&self, key: &str, message: String) {
        let mut runs = lock(&self.runs);
        let run = runs.entry(key.to_owned()).or_default();
        if run.last_error.as_deref() != Some(&message) {
            warn!(policy = %key, "{message}");
        }
        run.failures = run.failures.saturating_add(1);
        run.last_error = Some(message);
    }

    /// Records how a policy's turn went: a prune's outcomes (if it
    /// pruned) and a failed snapshot's error. A turn without errors ends a
    /// run of failures.
    fn record(
        &self,
        key: &str,
        pruned: Option<&[VolumeOutcome]>,
        snapshot_error: Option<String>,
        now: u64,
    ) {
        let mut errors: Vec<String> = snapshot_error.into_iter().collect();
        if let Some(outcomes) = pruned {
            let mut space = Vec::new();
            let mut destroyed = 0u64;
            for o in outcomes {
                for d in &o.destroyed {
                    info!(policy = %key, snapshot = %d.name, reason = %d.reason, frees = d.frees, "pruned");
                    destroyed += 1;
                    if d.reason == Reason::SpaceAware {
                        space.push(d.name.clone());
                    }
                }
                for (d, e) in &o.failed {
                    errors.push(format!("prune of {} failed: {e}", d.name));
                }
            }
            if !space.is_empty() {
                warn!(
                    policy = %key,
                    snapshots = space.len(),
                    "the pool is past the policy's space threshold: pruned beyond retention, \
                     oldest first"
                );
            }
            let mut runs = lock(&self.runs);
            let run = runs.entry(key.to_owned()).or_default();
            run.last_prune = Some(now);
            run.last_pruned = destroyed;
            // Added to, not replaced: a prune that finds nothing more to
            // destroy while the pool stays past the threshold does not end
            // the condition (it flapped so at every scheduled snapshot);
            // the pool's use going back under it does (refresh_alerts).
            run.space_pruned.pruned(&space);
        }
        if errors.is_empty() {
            let mut runs = lock(&self.runs);
            let run = runs.entry(key.to_owned()).or_default();
            run.failures = 0;
            run.last_error = None;
        } else {
            self.failed(key, errors.join("; "));
        }
    }

    /// `arbor prune`: every policy's prune (of `volume`'s policy only, if
    /// given) now, or with `dry_run` what it would destroy.
    pub fn prune(&self, req: &PruneRequest, now: u64) -> Result<PruneView> {
        let _one = lock(&self.exclusive);
        let loaded = store::load(&self.pool)?;
        let listing = Listing::of(&self.pool)?;
        let chosen: Vec<&Stored> = match &req.volume {
            Some(volume) => {
                let id = self.pool.lookup(volume)?;
                let stored = policy_of(&loaded.policies, id).ok_or_else(|| {
                    EngineError::not_found(format!("a policy for {volume} (arbor policy set)"))
                })?;
                vec![stored]
            }
            None => loaded.policies.iter().collect(),
        };
        let mut volumes = Vec::new();
        for stored in chosen {
            let usage = store::usage(&self.pool)?;
            let plans = self.prune_plans(&listing, &stored.policy, usage, now)?;
            let outcomes = self.execute(&plans, req.dry_run);
            if !req.dry_run {
                self.record(&stored.key, Some(&outcomes), None, now);
            }
            volumes.extend(outcomes.iter().map(|o| {
                PruneVolumeView {
                    volume: o.volume.clone(),
                    policy: stored.key.clone(),
                    destroy: o.destroyed.iter().map(decision_view).collect(),
                    keep: o.kept.iter().map(decision_view).collect(),
                    failed: o
                        .failed
                        .iter()
                        .map(|(d, e)| PruneFailureView {
                            name: d.name.clone(),
                            error: e.clone(),
                        })
                        .collect(),
                }
            }));
        }
        let frees_bytes = volumes
            .iter()
            .flat_map(|v| &v.destroy)
            .map(|d| d.frees_bytes)
            .fold(0u64, u64::saturating_add);
        Ok(PruneView {
            dry_run: req.dry_run,
            volumes,
            frees_bytes,
        })
    }

    /// `arbor policy set VOLUME`: the policy of `volume` and the volumes in
    /// `req.with`, replacing the one `volume` had.
    pub fn set(&self, volume: &str, req: &PolicyRequest) -> Result<PolicyView> {
        let _one = lock(&self.exclusive);
        let schedule: Schedule = req
            .schedule
            .parse()
            .map_err(|e: arbor_monitor::PolicyError| invalid(e.to_string()))?;
        let retention: Retention = req
            .retention
            .parse()
            .map_err(|e: arbor_monitor::PolicyError| invalid(e.to_string()))?;
        let loaded = store::load(&self.pool)?;
        let mut ids = Vec::new();
        for name in std::iter::once(volume).chain(req.with.iter().map(String::as_str)) {
            let id = self.pool.lookup(name)?;
            if self.pool.info(id)?.snapshot {
                return Err(invalid(format!(
                    "{name} is a snapshot: policies are set on volumes"
                )));
            }
            // Its policy snapshots must fit: a name an older version allowed may not.
            arbor_engine::check_volume_name(name)?;
            if self.replication.is_replica(name) {
                return Err(EngineError::read_only(format!(
                    "{name} (a replica: its snapshots come from its source)"
                ))
                .into());
            }
            if ids.contains(&id.0) {
                return Err(invalid(format!("{name} is named twice")));
            }
            ids.push(id.0);
        }
        let own = policy_of(&loaded.policies, VolumeId(ids[0])).map(|s| s.key.clone());
        for (&id, name) in ids
            .iter()
            .zip(std::iter::once(volume).chain(req.with.iter().map(String::as_str)))
        {
            if let Some(other) = policy_of(&loaded.policies, VolumeId(id)) {
                if Some(&other.key) != own.as_ref() {
                    return Err(EngineError::conflict(format!(
                        "{name} already has a policy ({}); clear it first (arbor policy clear {name})",
                        other.key
                    ))
                    .into());
                }
            }
        }
        let mut policy = Policy::new(ids, schedule, retention);
        if let Some(prefix) = &req.prefix {
            policy.prefix = prefix.clone();
        }
        policy.warn_age_secs = req.warn_age_secs;
        policy.crit_age_secs = req.crit_age_secs;
        policy.space_prune_percent = req.space_prune_percent;
        policy.validate().map_err(|e| invalid(e.to_string()))?;
        let key =
            own.unwrap_or_else(|| store::new_key(VolumeId(policy.volumes[0]), &loaded.policies));
        store::store(&self.pool, &key, &policy)?;
        info!(policy = %key, volume, schedule = %policy.schedule, retention = %policy.retention, "policy set");
        let listing = Listing::of(&self.pool)?;
        Ok(self.view(&Stored { key, policy }, &listing, unix_now()))
    }

    /// `arbor policy clear VOLUME`: removes the policy `volume` is in (for
    /// all its volumes); its snapshots stay. Whether there was one.
    pub fn clear(&self, volume: &str) -> Result<bool> {
        let _one = lock(&self.exclusive);
        let id = self.pool.lookup(volume)?;
        let loaded = store::load(&self.pool)?;
        let Some(stored) = policy_of(&loaded.policies, id) else {
            return Ok(false);
        };
        store::remove(&self.pool, &stored.key)?;
        lock(&self.runs).remove(&stored.key);
        info!(policy = %stored.key, volume, "policy cleared");
        Ok(true)
    }

    /// Every policy, as `arbor policy show` shows it; of `volume` only, if
    /// given.
    pub fn views(&self, volume: Option<&str>, now: u64) -> Result<Vec<PolicyView>> {
        let loaded = store::load(&self.pool)?;
        let listing = Listing::of(&self.pool)?;
        let chosen: Vec<&Stored> = match volume {
            Some(volume) => {
                let id = self.pool.lookup(volume)?;
                policy_of(&loaded.policies, id).into_iter().collect()
            }
            None => loaded.policies.iter().collect(),
        };
        Ok(chosen
            .into_iter()
            .map(|s| self.view(s, &listing, now))
            .collect())
    }

    fn view(&self, stored: &Stored, listing: &Listing, now: u64) -> PolicyView {
        let p = &stored.policy;
        let last_run = listing.last_run(p, now);
        let next = p.schedule.next_run(last_run, now);
        let run = lock(&self.runs)
            .get(&stored.key)
            .cloned()
            .unwrap_or_default();
        let (warn_age, crit_age) = p.ages();
        PolicyView {
            id: stored.key.clone(),
            volumes: listing
                .members(p)
                .into_iter()
                .map(|v| v.name.clone())
                .collect(),
            schedule: p.schedule.to_string(),
            retention: p.retention.to_string(),
            prefix: p.prefix.clone(),
            warn_age_secs: warn_age,
            crit_age_secs: crit_age,
            space_prune_percent: p.space_prune_percent,
            last_run,
            next_run: (next != u64::MAX).then_some(next),
            snapshots: p
                .volumes
                .iter()
                .map(|&id| listing.policy_snapshots(p, id).len() as u64)
                .sum(),
            last_prune: run.last_prune,
            last_pruned: run.last_pruned,
            failures: run.failures,
            last_error: run.last_error,
        }
    }

    /// Carries out one policy's turn at `now` as [`tick`] plans it: its
    /// scheduled snapshot if due, then its prune if due (`last_prune`:
    /// when it last pruned), planned from the pool after the snapshot.
    fn turn(
        &self,
        policy: &Policy,
        now: u64,
        last_prune: Option<u64>,
    ) -> Result<Turn, EngineError> {
        let mut listing = Listing::of(&self.pool)?;
        let mut turn = Turn::default();
        if let Some(due) = tick::snapshot_due(policy, &listing, now) {
            let taken = due
                .map_err(refused_snapshot)
                .and_then(|group| self.pool.snapshot_group(&group.full).map(|_| group.snap));
            match taken {
                Err(e) if e.stops_pool() => return Err(e),
                Ok(snap) => {
                    listing = Listing::of(&self.pool)?;
                    turn.taken = Some(Ok(snap));
                }
                Err(e) => turn.taken = Some(Err(e)),
            }
        }
        let usage = store::usage(&self.pool)?;
        let taken = matches!(turn.taken, Some(Ok(_)));
        if tick::prune_due(policy, taken, last_prune, now, usage) {
            let plans = self.prune_plans(&listing, policy, usage, now)?;
            turn.pruned = Some(self.execute(&plans, false));
        }
        Ok(turn)
    }

    /// The prune plans of `policy`'s volumes at `now`: their snapshots as
    /// the pool has them, and what keeps one in use here (NBD clients, a
    /// send) counted as a hold.
    fn prune_plans(
        &self,
        listing: &Listing,
        policy: &Policy,
        usage: Usage,
        now: u64,
    ) -> Result<Vec<VolumePlan>, EngineError> {
        let mut volumes = store::candidates(&self.pool, listing, policy)?;
        for (id, candidate) in volumes.iter_mut().flat_map(|v| v.snapshots.iter_mut()) {
            if let Some(user) = self.in_use.reason(*id) {
                candidate.held.push(user);
            }
        }
        Ok(tick::prune_plans(policy, &volumes, usage, now))
    }

    /// Carries out `plans`' destroys in order, or with `dry_run` only
    /// reports them: a dry run and a prune made from the same plans list
    /// the same snapshots.
    fn execute(&self, plans: &[VolumePlan], dry_run: bool) -> Vec<VolumeOutcome> {
        plans
            .iter()
            .map(|p| {
                if dry_run {
                    return VolumeOutcome::dry_run(p);
                }
                let results = p.plan.destroy.iter().map(|d| self.destroy(&d.name));
                VolumeOutcome::of(p, results.collect())
            })
            .collect()
    }

    /// A prune's destroy: as `arbor destroy` without force (refused while
    /// NBD clients have it open or a send reads it).
    fn destroy(&self, name: &str) -> Result<(), String> {
        self.destroyer.destroy(name, false).map_err(|e| e.chain())
    }

    /// The active alerts, critical first.
    pub fn alerts(&self) -> Vec<AlertView> {
        lock(&self.alerts).active()
    }

    fn refresh_alerts(&self, policies: &[Stored], listing: &Listing, now: u64) -> Result<()> {
        let s = self.pool.pool_stats()?;
        let held = |kind, subject| lock(&self.alerts).severity(kind, subject);
        let mut found: Vec<Condition> = [
            alerts::space(
                AlertKind::DataUsage,
                "data",
                s.data_used_bytes,
                s.data_bytes,
                &self.space,
                held(AlertKind::DataUsage, "data"),
            ),
            alerts::space(
                AlertKind::MetadataUsage,
                "metadata",
                s.metadata_used_bytes,
                s.metadata_bytes,
                &self.space,
                held(AlertKind::MetadataUsage, "metadata"),
            ),
        ]
        .into_iter()
        .flatten()
        .collect();
        let runs = {
            let mut runs = lock(&self.runs);
            for stored in policies {
                if let Some(run) = runs.get_mut(&stored.key) {
                    run.space_pruned.observe(
                        s.data_used_bytes,
                        s.data_bytes,
                        stored.policy.space_prune_percent,
                    );
                }
            }
            runs.clone()
        };
        for stored in policies {
            let (warn_age, crit_age) = stored.policy.ages();
            for volume in listing.members(&stored.policy) {
                let newest = listing
                    .policy_snapshots(&stored.policy, volume.id.0)
                    .last()
                    .map(|s| s.stamp);
                if let Some(stamp) = newest {
                    found.extend(alerts::snapshot_age(
                        &volume.name,
                        now.saturating_sub(stamp),
                        warn_age,
                        crit_age,
                    ));
                }
            }
            let Some(run) = runs.get(&stored.key) else {
                continue;
            };
            if run.failures > 0 {
                found.push(Condition::new(
                    AlertKind::PruneFailed,
                    if run.failures >= CRITICAL_FAILURES {
                        Severity::Critical
                    } else {
                        Severity::Warning
                    },
                    &stored.key,
                    format!(
                        "{} ({} in a row)",
                        run.last_error.as_deref().unwrap_or("failed"),
                        run.failures
                    ),
                ));
            }
            found.extend(run.space_pruned.condition(&stored.key));
        }
        for (key, why) in runs
            .iter()
            .filter(|(k, _)| !policies.iter().any(|s| &s.key == *k))
        {
            if why.failures > 0 {
                found.push(Condition::new(
                    AlertKind::PruneFailed,
                    Severity::Critical,
                    key,
                    why.last_error.clone().unwrap_or_default(),
                ));
            }
        }
        for pair in self.replication.view().pairs {
            found.extend(alerts::replication_lag(&pair));
        }
        for o in self.pool.origins()? {
            if let Some(loss) = o.loss.filter(|l| l.accepted_unix == 0) {
                found.push(Condition::new(
                    AlertKind::OriginFailed,
                    Severity::Critical,
                    &o.name,
                    format!(
                        "its device shrank to {} bytes: it serves no I/O, and what it held \
                         from there on is lost (arbor origin list, arbor check)",
                        loss.from
                    ),
                ));
            }
        }
        let damaged = self.pool.damage_count()?;
        if damaged > 0 {
            found.push(Condition::new(
                AlertKind::DataDamage,
                Severity::Critical,
                "pool",
                format!(
                    "{damaged} data block{} do not match their checksums: reads of them fail \
                     (arbor pool damage lists them and who reads them)",
                    if damaged == 1 { "" } else { "s" }
                ),
            ));
        }
        found.extend(self.scrub.conditions());
        found.extend(self.backups.conditions(now));
        // Each change is logged by the book; metrics read it at a scrape.
        lock(&self.alerts).update(found, now);
        Ok(())
    }
}
