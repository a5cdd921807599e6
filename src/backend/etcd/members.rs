//! Which member of a cluster a request goes to.
//!
//! etcd-client balances over its endpoints with tower's power-of-two-choices, but every
//! endpoint reports the same load, so the choice is random among the connections that are
//! "ready". A frozen member (a paused process, a stopped VM) stays ready: its kernel still
//! completes the TCP handshake, and the HTTP/2 handshake does not wait for the server. So a
//! request in every few went to it and waited its whole timeout, for as long as the member was
//! frozen, and its retries could land there again: a session's renewals then failed for longer
//! than its lease (design.md, 2026-11-29).
//!
//! With more than one endpoint, baton therefore picks the member itself, in turn, over a
//! connection of that member alone; a member whose request timed out or could not be served
//! is passed over for [`AVOID_FOR`], after which one request at a time tries it again. Watch
//! streams (of waits, value watches and observers) are opened the same way
//! ([`EtcdTransport::ask`](super::watch::EtcdTransport::ask)). The balanced client stays for
//! [`EtcdBackend::client`](super::EtcdBackend::client).

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// How long a member whose request failed is passed over.
pub(super) const AVOID_FOR: Duration = Duration::from_secs(10);

/// The members of a cluster, each with a client of its own, made on its first request.
pub(super) struct Members {
    endpoints: Vec<String>,
    options: ConnectOptions,
    clients: Vec<OnceCell<Client>>,
    /// Until when each member is passed over (`None`: it is not).
    avoided: Mutex<Vec<Option<Instant>>>,
    turn: AtomicUsize,
    /// How long a request may take (the backend's request timeout): a member tried again is
    /// passed over for that long meanwhile, so that one request at a time tries it.
    trial: Duration,
}

impl Members {
    /// The members of `endpoints`, or `None` for a single endpoint (nothing to choose).
    pub(super) fn new(
        endpoints: &[String],
        options: &ConnectOptions,
        request_timeout: Duration,
    ) -> Option<Self> {
        (endpoints.len() > 1).then(|| Self {
            trial: request_timeout,
            endpoints: endpoints.to_vec(),
            options: options.clone(),
            clients: endpoints.iter().map(|_| OnceCell::new()).collect(),
            avoided: Mutex::new(vec![None; endpoints.len()]),
            turn: AtomicUsize::new(0),
        })
    }

    /// The member the next request goes to: the next in turn that is not passed over, or,
    /// when every one is, the one whose time is up first. A member that was passed over is
    /// tried by one request at a time: until that request is answered or times out, the
    /// others pass it over still.
    pub(super) fn pick(&self) -> usize {
        let n = self.endpoints.len();
        let start = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        let now = Instant::now();
        let mut avoided = self.avoided.lock().unwrap_or_else(|p| p.into_inner());
        let i = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| avoided[i].is_none_or(|until| until <= now))
            .or_else(|| (0..n).min_by_key(|&i| avoided[i]))
            .unwrap_or(start);
        if avoided[i].is_some() {
            avoided[i] = Some(now + self.trial);
        }
        i
    }

    /// The member's own client, connected on first use.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection not yet made is made by the next call.
    async fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        self.clients[i]
            .get_or_try_init(|| {
                Client::connect([self.endpoints[i].as_str()], Some(self.options.clone()))
            })
            .await
            .cloned()
    }

    /// Member `i`'s client within the request timeout; a member that cannot be reached (or
    /// logged in to) in that time is passed over.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection not yet made is made by the next call.
    pub(super) async fn connected(&self, i: usize) -> Result<Client, etcd_client::Error> {
        let connected = tokio::time::timeout(self.trial, self.client(i))
            .await
            .unwrap_or_else(|_| Err(self.no_answer(i)));
        if connected.is_err() {
            self.failed(i);
        }
        connected
    }

    /// `ask`'s answer from member `i`, within the request timeout: a member that does not
    /// answer, or answers that it cannot serve, is passed over; one that answers is not.
    ///
    /// # Cancel safety
    /// Cancel safe if `ask` is: an unanswered request is dropped.
    pub(super) async fn ask<T, Fut>(
        &self,
        i: usize,
        ask: impl FnOnce(Client) -> Fut,
    ) -> Result<T, etcd_client::Error>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let asked = async { ask(self.client(i).await?).await };
        match tokio::time::timeout(self.trial, asked).await {
            Ok(Ok(answer)) => {
                self.answered(i);
                Ok(answer)
            }
            Ok(Err(e)) => {
                if super::tonic_code::member_unfit(&e) {
                    self.failed(i);
                }
                Err(e)
            }
            Err(_) => {
                self.failed(i);
                Err(self.no_answer(i))
            }
        }
    }

    /// `ask`'s answer from the first member to give one, asking all at once, each within
    /// the request timeout (so that the caller hears of the members that answered with an
    /// error, and may ask again, without waiting for one that never answers); if every one
    /// fails, the last failure.
    ///
    /// # Cancel safety
    /// Cancel safe if `ask` is: the requests still unanswered are dropped.
    pub(super) async fn first_to_answer<T, Fut>(
        &self,
        ask: impl Fn(Client) -> Fut,
    ) -> Result<T, etcd_client::Error>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let ask = &ask;
        let asks = (0..self.endpoints.len()).map(|i| Box::pin(self.ask(i, ask)));
        futures::future::select_ok(asks)
            .await
            .map(|(answer, _)| answer)
    }

    /// The error for member `i` not answering within the request timeout.
    fn no_answer(&self, i: usize) -> etcd_client::Error {
        etcd_client::Error::IoError(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "{} did not answer within {:?}",
                self.endpoints[i], self.trial
            ),
        ))
    }

    /// A request to member `i` timed out or could not be served there: pass it over for a
    /// while.
    pub(super) fn failed(&self, i: usize) {
        let mut avoided = self.avoided.lock().unwrap_or_else(|p| p.into_inner());
        if avoided[i].is_none() {
            tracing::debug!(endpoint = %self.endpoints[i], "etcd member did not answer; passing it over");
        }
        avoided[i] = Some(Instant::now() + AVOID_FOR);
    }

    /// Member `i` answered: it is no longer passed over.
    pub(super) fn answered(&self, i: usize) {
        let mut avoided = self.avoided.lock().unwrap_or_else(|p| p.into_inner());
        if avoided[i].take().is_some() {
            tracing::debug!(endpoint = %self.endpoints[i], "etcd member answers again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRIAL: Duration = Duration::from_secs(1);

    fn members(n: usize) -> Members {
        let endpoints: Vec<String> = (0..n).map(|i| format!("127.0.0.1:{}", 1000 + i)).collect();
        Members::new(&endpoints, &ConnectOptions::new(), TRIAL).unwrap()
    }

    #[test]
    fn a_single_endpoint_has_nothing_to_choose() {
        let one = ["127.0.0.1:1".to_owned()];
        assert!(Members::new(&one, &ConnectOptions::new(), TRIAL).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn members_take_turns_and_one_that_failed_is_passed_over_for_a_while() {
        let m = members(3);
        assert_eq!(
            (0..6).map(|_| m.pick()).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2]
        );
        m.failed(1);
        assert_eq!((0..4).map(|_| m.pick()).collect::<Vec<_>>(), [0, 2, 2, 0]);
        tokio::time::advance(AVOID_FOR).await;
        assert_eq!((0..3).map(|_| m.pick()).collect::<Vec<_>>(), [1, 2, 0]);
        m.failed(1);
        m.answered(1);
        assert_eq!((0..3).map(|_| m.pick()).collect::<Vec<_>>(), [1, 2, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_whose_time_is_up_is_tried_by_one_request_at_a_time() {
        let m = members(2);
        m.failed(0);
        tokio::time::advance(AVOID_FOR).await;
        // The trial, then the others while it is out.
        assert_eq!((0..4).map(|_| m.pick()).collect::<Vec<_>>(), [0, 1, 1, 1]);
        // Its trial timed out without an answer: tried again, one request.
        tokio::time::advance(TRIAL).await;
        assert_eq!((0..3).map(|_| m.pick()).collect::<Vec<_>>(), [0, 1, 1]);
        // Answered: back in turn.
        m.answered(0);
        assert_eq!((0..2).map(|_| m.pick()).collect::<Vec<_>>(), [1, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn when_every_member_failed_the_one_that_failed_first_is_tried() {
        let m = members(3);
        m.failed(2);
        tokio::time::advance(Duration::from_secs(1)).await;
        m.failed(0);
        m.failed(1);
        assert_eq!(m.pick(), 2);
        assert_eq!(m.pick(), 2);
    }
}
