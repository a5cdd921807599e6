//! The fence suite: what every [`Fence`] must do, run unchanged on the memory, etcd, SQLite
//! and PostgreSQL fences (`tests/fence.rs`). Each function takes a fence and a resource name
//! of its own.

use baton::{Fence, FencingToken, Ticket};

use super::*;

fn t(token: u64) -> Ticket {
    FencingToken::new(token).into()
}

fn of(lock: &str, token: u64) -> Ticket {
    Ticket::new(FencingToken::new(token), lock)
}

async fn stored(fence: &dyn Fence, resource: &str) -> (u64, Vec<u8>) {
    let (token, data) = fence.read(resource).await.unwrap().expect("written");
    (token.get(), data)
}

/// Equal tokens are admitted (one holder claims and writes several times); lower ones are
/// refused with the highest token in the error, and nothing is written.
pub async fn equal_tokens_are_admitted_lower_ones_refused(fence: Arc<dyn Fence>, r: &str) {
    fence.write(r, t(5), b"a").await.unwrap();
    fence.write(r, t(5), b"b").await.unwrap();
    assert_eq!(
        fence.claim(r, t(5)).await.unwrap().as_deref(),
        Some(&b"b"[..])
    );
    fence.write(r, t(5), b"c").await.unwrap();
    assert_eq!(stored(&*fence, r).await, (5, b"c".to_vec()));
    for refused in [
        fence.write(r, t(4), b"late").await,
        fence.claim(r, t(4)).await.map(drop),
    ] {
        assert!(
            matches!(refused, Err(Error::StaleToken { token, highest, .. }) if token.get() == 4 && highest.get() == 5),
            "{refused:?}"
        );
    }
    assert_eq!(
        stored(&*fence, r).await,
        (5, b"c".to_vec()),
        "nothing written"
    );
}

/// A claim refuses every lower token from then on, before the claimant writes anything, and
/// returns the data as it stands (`None` before any write).
pub async fn a_claim_refuses_older_tokens_before_any_write(fence: Arc<dyn Fence>, r: &str) {
    assert_eq!(fence.claim(r, t(3)).await.unwrap(), None, "never written");
    fence.write(r, t(3), b"five").await.unwrap();
    assert_eq!(
        fence.claim(r, t(7)).await.unwrap().as_deref(),
        Some(&b"five"[..])
    );
    let late = fence.write(r, t(3), b"four").await;
    assert!(
        matches!(late, Err(Error::StaleToken { highest, .. }) if highest.get() == 7),
        "{late:?}"
    );
    assert_eq!(stored(&*fence, r).await, (7, b"five".to_vec()));
}

/// The read-modify-write interleaving of docs/fencing.md, step by step: A (token 4) claims and
/// reads, pauses; B (token 5) claims and reads the same value; A wakes and writes: refused;
/// B writes. Without B's claim, A's write would have landed after B's read.
pub async fn read_modify_write_with_a_paused_holder(fence: Arc<dyn Fence>, r: &str) {
    fence.write(r, t(3), b"5").await.unwrap();
    let a_read = fence.claim(r, t(4)).await.unwrap().unwrap();
    // A pauses; its lease ends; B is granted token 5.
    let b_read = fence.claim(r, t(5)).await.unwrap().unwrap();
    assert_eq!(a_read, b_read);
    let a_late = fence.write(r, t(4), b"4").await;
    assert!(
        matches!(a_late, Err(Error::StaleToken { .. })),
        "{a_late:?}"
    );
    fence.write(r, t(5), b"4").await.unwrap();
    assert_eq!(
        stored(&*fence, r).await,
        (5, b"4".to_vec()),
        "one sale, not two"
    );
}

/// A resource is bound to the first lock that claims or writes it with a ticket naming its
/// lock; a ticket of another lock is refused, even with a higher token, and the real holder
/// goes on. A bare token names no lock and is compared as a token only.
pub async fn a_resource_is_bound_to_its_first_lock(fence: Arc<dyn Fence>, r: &str) {
    fence.claim(r, of("orders/lock", 5)).await.unwrap();
    let foreign = fence.write(r, of("users/lock", 900), b"x").await;
    assert!(
        matches!(&foreign, Err(Error::ForeignLock { bound, lock, .. }) if bound == "orders/lock" && lock == "users/lock"),
        "{foreign:?}"
    );
    let foreign_claim = fence.claim(r, of("users/lock", 900)).await;
    assert!(
        matches!(foreign_claim, Err(Error::ForeignLock { .. })),
        "{foreign_claim:?}"
    );
    fence.write(r, of("orders/lock", 6), b"mine").await.unwrap();
    assert_eq!(stored(&*fence, r).await, (6, b"mine".to_vec()));
    // An unbound token is compared as a token.
    assert!(matches!(
        fence.write(r, t(2), b"x").await,
        Err(Error::StaleToken { .. })
    ));
}

/// 16 concurrent writers with interleaved tokens: refusals name a higher token that was
/// accepted, and what is stored at the end is the highest token's data.
pub async fn sixteen_writers_keep_the_highest(fence: Arc<dyn Fence>, resource: &str) {
    let tokens: Vec<u64> = (0..16u64).map(|i| (i * 7) % 16 + 1).collect();
    let writes = tokens.iter().map(|&token| {
        let (fence, resource) = (Arc::clone(&fence), resource.to_owned());
        tokio::spawn(async move {
            let r = fence
                .write(&resource, t(token), format!("from {token}").as_bytes())
                .await;
            (token, r)
        })
    });
    for joined in futures::future::join_all(writes).await {
        let (token, r) = joined.unwrap();
        match r {
            Ok(()) => {}
            Err(Error::StaleToken {
                token: refused,
                highest,
                ..
            }) => {
                assert_eq!(refused.get(), token);
                assert!(
                    highest.get() > token,
                    "refused {token} although only {highest} was accepted"
                );
            }
            Err(e) => panic!("write {token}: {e}"),
        }
    }
    assert_eq!(stored(&*fence, resource).await, (16, b"from 16".to_vec()));
}

/// 16 concurrent read-modify-write increments, each claim, read, write with its own token:
/// no update is lost. The counter ends equal to the number of writes that were accepted.
pub async fn concurrent_increments_lose_no_update(fence: Arc<dyn Fence>, resource: &str) {
    fence.write(resource, t(1), b"0").await.unwrap();
    let writers = (2..=17u64).map(|token| {
        let (fence, resource) = (Arc::clone(&fence), resource.to_owned());
        tokio::spawn(async move {
            let n: u64 = match fence.claim(&resource, t(token)).await {
                Ok(data) => String::from_utf8(data.unwrap()).unwrap().parse().unwrap(),
                Err(Error::StaleToken { .. }) => return false,
                Err(e) => panic!("claim {token}: {e}"),
            };
            tokio::task::yield_now().await;
            match fence
                .write(&resource, t(token), (n + 1).to_string().as_bytes())
                .await
            {
                Ok(()) => true,
                Err(Error::StaleToken { .. }) => false,
                Err(e) => panic!("write {token}: {e}"),
            }
        })
    });
    let accepted = futures::future::join_all(writers)
        .await
        .into_iter()
        .filter(|r| *r.as_ref().unwrap())
        .count();
    let (_, data) = stored(&*fence, resource).await;
    let counter: usize = String::from_utf8(data).unwrap().parse().unwrap();
    assert!(accepted >= 1);
    assert_eq!(counter, accepted, "an increment was lost");
}

/// Bad input is refused and writes nothing: the stored token and data stay as they were.
pub async fn bad_input_is_refused_and_writes_nothing(fence: Arc<dyn Fence>, resource: &str) {
    fence.write(resource, t(3), b"kept").await.unwrap();
    for zero in [
        fence.write(resource, t(0), b"x").await,
        fence.claim(resource, t(0)).await.map(drop),
    ] {
        assert!(matches!(zero, Err(Error::InvalidArgument(_))), "{zero:?}");
    }
    for empty in [
        fence.write("", t(5), b"x").await,
        fence.claim("", t(5)).await.map(drop),
    ] {
        assert!(matches!(empty, Err(Error::InvalidArgument(_))), "{empty:?}");
    }
    assert!(matches!(
        fence.read("").await,
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        stored(&*fence, resource).await,
        (3, b"kept".to_vec()),
        "nothing written"
    );
}

/// A holder whose renewals stop loses the lock to its successor; its late write through the
/// fence is refused, every time (the successor claims before it reads).
pub async fn stale_writes_are_fenced(rig: Rig, fence: Arc<dyn Fence>, rounds: usize) {
    let name = rig.name("stale-fenced");
    let resource = rig.name("stale-fenced-resource");
    for round in 0..rounds {
        let faulty = FaultyBackend::wrap(Arc::clone(&rig.backend));
        let paused = session_on(faulty.clone(), Duration::from_secs(2)).await;
        let old = Mutex::new(&paused, &name).unwrap().lock().await.unwrap();
        fence.claim(&resource, old.ticket()).await.unwrap();
        let successor_session = rig.session().await;
        let successor = spawn_queued(&*rig.outside, &successor_session, &name, 2).await;
        // The holder "pauses": its renewals stop; the server expires its lease.
        faulty.inject_every(Call::KeepAlive, Fault::FailBefore);
        let new = within("the successor", Duration::from_secs(15), successor)
            .await
            .unwrap()
            .unwrap();
        fence.claim(&resource, new.ticket()).await.unwrap();
        // The old holder wakes up and writes, before the successor has written anything.
        let late = fence.write(&resource, old.ticket(), b"late").await;
        assert!(
            matches!(late, Err(Error::StaleToken { highest, .. }) if highest == new.fencing_token()),
            "round {round}: {late:?}"
        );
        fence
            .write(&resource, new.ticket(), format!("new {round}").as_bytes())
            .await
            .unwrap();
        let (token, data) = fence.read(&resource).await.unwrap().unwrap();
        assert_eq!(token, new.fencing_token());
        assert_eq!(data, format!("new {round}").as_bytes());
        new.release().await.unwrap();
        drop(old);
    }
}

/// Generates one test per fence-suite function for a fence constructor.
#[macro_export]
macro_rules! fence_suite {
    (mod $module:ident; $make:path; $($attr:tt)*) => {
        mod $module {
            $crate::fence_suite!(@one $make; ($($attr)*); equal_tokens_are_admitted_lower_ones_refused);
            $crate::fence_suite!(@one $make; ($($attr)*); a_claim_refuses_older_tokens_before_any_write);
            $crate::fence_suite!(@one $make; ($($attr)*); read_modify_write_with_a_paused_holder);
            $crate::fence_suite!(@one $make; ($($attr)*); a_resource_is_bound_to_its_first_lock);
            $crate::fence_suite!(@one $make; ($($attr)*); sixteen_writers_keep_the_highest);
            $crate::fence_suite!(@one $make; ($($attr)*); concurrent_increments_lose_no_update);
            $crate::fence_suite!(@one $make; ($($attr)*); bad_input_is_refused_and_writes_nothing);
        }
    };
    (@one $make:path; ($($attr:tt)*); $test:ident) => {
        #[tokio::test($($attr)*)]
        async fn $test() {
            $crate::support::within(
                stringify!($test),
                std::time::Duration::from_secs(300),
                async {
                    let fence = $make(stringify!($test)).await;
                    $crate::support::fences::$test(fence, "r").await
                },
            )
            .await;
        }
    };
}
