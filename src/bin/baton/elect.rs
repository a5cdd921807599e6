//! `baton elect`: campaign and lead (see `hold`), or observe an election (`--listen`).

use std::sync::Arc;

use baton::{Backend, Election, LeaderEvent, Session};
use futures::StreamExt;

use crate::closed_output;
use crate::connect::{finish, session};
use crate::failure::{Failure, exit};
use crate::hold::{Held, Holder};
use crate::output::{json_str, one_line, out};
use crate::wait::{Signals, wait_granted};

/// Campaigns in `name` with `proposal` on a session of its own and leads as `h` says, or
/// with `listen` prints its leader events (JSON lines with `json`); then ends the session.
pub(crate) async fn elect(
    backend: Arc<dyn Backend>,
    h: Holder<'_>,
    name: &str,
    proposal: Option<String>,
    listen: bool,
    json: bool,
) -> Result<u8, Failure> {
    let session = session(backend, h.ttl, h.deadline).await?;
    let result = match (listen, proposal) {
        (true, _) => listen_election(&session, name, json, h.signals).await,
        (false, Some(proposal)) => {
            let election = Election::new(&session, name)?;
            let what = format!("leadership of `{name}`");
            h.events.emit("waiting", &[])?;
            match wait_granted(&what, h.deadline, h.signals, election.campaign(proposal)).await {
                Ok(leadership) => h.hold(what, &session, Held::Lead(leadership)).await,
                Err(e) => Err(e),
            }
        }
        (false, None) => Err(Failure::new(exit::USAGE, "a proposal is required")),
    };
    finish(&session, &result).await;
    result
}

async fn listen_election(
    session: &Session,
    name: &str,
    json: bool,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let election = Election::new(session, name)?;
    let mut events = election.observe();
    let closed = closed_output::closed();
    tokio::pin!(closed);
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = signals.recv() => return Ok(0),
            // `baton elect --listen x | head -1`: the reader has what it wanted.
            () = &mut closed => return Ok(0),
        };
        match event {
            None => return Err(Failure::new(exit::ERROR, "the observer stopped")),
            Some(Err(e)) => eprintln!(
                "baton: observing `{name}`: {} (retrying)",
                one_line(&e.to_string())
            ),
            Some(Ok(event)) => match out(&render_event(&event, json)) {
                Ok(()) => {}
                // `baton elect --listen | head -1`: the reader has what it wanted.
                Err(f) if f.code == exit::BROKEN_PIPE => return Ok(0),
                Err(f) => return Err(f),
            },
        }
    }
}

fn render_event(event: &LeaderEvent, json: bool) -> String {
    let (kind, leader) = match event {
        LeaderEvent::Elected(l) => ("elected", Some(l)),
        LeaderEvent::Proclaimed(l) => ("proclaimed", Some(l)),
        LeaderEvent::Vacant => ("vacant", None),
        LeaderEvent::Skipped => ("skipped", None),
        _ => ("unknown", None),
    };
    match (json, leader) {
        (true, Some(l)) => format!(
            "{{\"event\":\"{kind}\",\"key\":{},\"value\":{},\"token\":{}}}",
            json_str(l.key()),
            json_str(&String::from_utf8_lossy(l.value())),
            l.fencing_token()
        ),
        (true, None) => format!("{{\"event\":\"{kind}\"}}"),
        (false, Some(l)) => one_line(&String::from_utf8_lossy(l.value())),
        (false, None) if kind == "skipped" => "(changes missed)".to_owned(),
        (false, None) => "(no leader)".to_owned(),
    }
}
