//! Feeds arbitrary bytes to the monitor's parsers (docs/MONITOR.md): the
//! stored policy (JSON, from the pool), schedules and retention rules (from
//! the CLI and the API), and the property framing the policy is stored in
//! (docs/FORMAT.md §6). None may panic or accept what it cannot write
//! back: every accepted value displays or encodes to text that parses to
//! the same value, and a parsed schedule and rule then run (due, next run,
//! a prune plan) without panicking, whatever the time.
//!
//! Input: byte 0 selects the parser (0 policy, 1 schedule, 2 retention,
//! 3 property framing); bytes 1..9 are a time; the rest is the input.
#![no_main]

use arbor_monitor::prune::{plan, space_aware, Candidate};
use arbor_monitor::{Policy, Retention, Schedule};
use libfuzzer_sys::fuzz_target;

fn candidates(now: u64, seed: &[u8]) -> Vec<Candidate> {
    seed.iter()
        .take(64)
        .enumerate()
        .map(|(i, &b)| Candidate {
            name: format!("v@s{i}"),
            created: now.wrapping_sub(u64::from(b) * 3600 + i as u64),
            policy_made: b % 7 != 0,
            held: if b % 11 == 0 {
                vec!["t".into()]
            } else {
                vec![]
            },
            needed: b % 13 == 0,
            exclusive_bytes: u64::from(b) << 20,
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let (which, rest) = (data[0] % 4, &data[9..]);
    let mut time = [0u8; 8];
    time.copy_from_slice(&data[1..9]);
    let now = u64::from_le_bytes(time) % (1 << 40);
    match which {
        0 => {
            if let Ok(policy) = Policy::decode(rest) {
                policy.validate().expect("a decoded policy is valid");
                let again = Policy::decode(&policy.encode()).expect("an encoded policy decodes");
                assert_eq!(again, policy);
                let _ = policy.ages();
            }
        }
        1 => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            if let Ok(schedule) = text.parse::<Schedule>() {
                let back: Schedule = schedule.to_string().parse().expect("display parses");
                assert_eq!(back, schedule);
                let last = now.checked_sub(u64::from(rest.len() as u32) * 977);
                let _ = schedule.due(last, now);
                let next = schedule.next_run(last, now);
                assert!(next >= now.min(next), "next run");
                let _ = schedule.last_slot(now);
            }
        }
        2 => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            if let Ok(retention) = text.parse::<Retention>() {
                let back: Retention = retention.to_string().parse().expect("display parses");
                assert_eq!(back, retention);
                let c = candidates(now, rest);
                let p = plan(&c, &retention, now);
                assert_eq!(p.destroy.len() + p.keep.len(), c.len());
                let _ = space_aware(&p, 90 << 20, 100 << 20, 50);
            }
        }
        _ => {
            if let Ok(value) = arbor_format::decode_property(rest) {
                let again = arbor_format::encode_property(value).expect("a decoded value fits");
                assert_eq!(arbor_format::decode_property(&again).unwrap(), value);
            }
        }
    }
});
