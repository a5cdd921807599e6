//! The fencing scenarios of the `inventory`, `payment` and `bank_transfer` examples, with the
//! first holder paused at every point (after its grant; after reading, before writing; in the
//! middle of its writes; after writing), on the memory backend and on etcd: each checks its
//! own invariant (stock sold + left = stocked; exactly one charge; balances conserved, each
//! transfer applied once) and tells its story: which late write was refused, with the two
//! tokens.

#[path = "../examples/common/scenarios.rs"]
#[allow(dead_code, unreachable_pub)]
mod scenarios;

use std::sync::Arc;

use baton::testing::EtcdNode;
use baton::{EtcdFence, MemoryBackend, MemoryFence};
use scenarios::{Pause, Report, World};

/// The story a scenario tells at `pause` (what `cargo run --example <name>` prints): where the
/// first holder paused and its successor's token, and, where a late write comes after the
/// pause, that the resource REFUSED it, with the refused token below the one it had seen.
fn assert_story(scenario: &str, pause: Pause, report: &Report) {
    let text = report.to_string();
    assert!(
        report
            .lines
            .first()
            .is_some_and(|l| l.contains("granted the lock with token")),
        "{scenario}, {pause}:\n{text}"
    );
    match pause {
        Pause::Never => assert!(text.contains("no pause"), "{scenario}, {pause}:\n{text}"),
        Pause::AfterWrite => assert!(
            text.contains("its lease runs out") && text.contains("no write refused"),
            "{scenario}, {pause}:\n{text}"
        ),
        Pause::AfterGrant | Pause::AfterRead | Pause::MidWrite => {
            assert!(
                text.contains("its lease runs out")
                    && text.contains("its successor is granted the lock with token"),
                "{scenario}, {pause}:\n{text}"
            );
            let refusal = report
                .refusal()
                .unwrap_or_else(|| panic!("{scenario}, {pause}: no refusal told:\n{text}"));
            // "... REFUSED: its token <refused> is older than token <seen>, which ..."
            let tokens: Vec<u64> = refusal
                .split("token ")
                .skip(1)
                .filter_map(|rest| {
                    rest.split(|c: char| !c.is_ascii_digit())
                        .next()?
                        .parse()
                        .ok()
                })
                .collect();
            assert!(
                matches!(tokens.as_slice(), [refused, seen] if refused < seen),
                "{scenario}, {pause}: {refusal}"
            );
        }
    }
}

async fn run_all(make: impl Fn(String) -> World) {
    for (i, pause) in Pause::ALL.into_iter().enumerate() {
        if Pause::INVENTORY.contains(&pause) {
            let report = scenarios::inventory(&make(format!("inventory-{i}")), pause)
                .await
                .unwrap();
            println!("inventory:\n{report}");
            assert_story("inventory", pause, &report);
        }
        let report = scenarios::payment(&make(format!("payment-{i}")), pause)
            .await
            .unwrap();
        println!("payment:\n{report}");
        assert_story("payment", pause, &report);
        let report = scenarios::bank_transfer(&make(format!("bank-{i}")), pause)
            .await
            .unwrap();
        println!("bank_transfer:\n{report}");
        assert_story("bank_transfer", pause, &report);
    }
}

#[tokio::test]
async fn scenarios_on_memory_at_every_pause_point() {
    run_all(|prefix| World {
        backend: Arc::new(MemoryBackend::new()),
        fence: Arc::new(MemoryFence::new()),
        prefix,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios_on_etcd_at_every_pause_point() {
    let backend = EtcdNode::shared().backend().await.unwrap();
    let run = format!("examples-{}", std::process::id());
    run_all(|name| World {
        backend: Arc::new(backend.clone()),
        fence: Arc::new(EtcdFence::new(backend.clone(), format!("{run}/{name}/fence")).unwrap()),
        prefix: format!("{run}/{name}"),
    })
    .await;
}
