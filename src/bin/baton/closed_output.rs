//! Noticing that nobody reads baton's standard output any more, without waiting for the next
//! write (issue #25): `baton lock x | head -1` must not hold the lock for a reader that is
//! gone, and `baton elect --listen x | head -1` must not run on until the next leader change.
//!
//! A writer learns that the reader of a pipe is gone only when it writes (EPIPE); but `poll`
//! reports it at once on the write end: POLLERR for a pipe with no reader left, POLLHUP for a
//! socket or terminal that hung up. A thread of its own waits in `poll` (for no event but
//! those two, which need no asking); a regular file or `/dev/null` never reports either, and
//! the thread then waits for nothing until baton exits.

use std::future::Future;
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// Resolves once standard output is a pipe, socket or terminal whose other end is closed;
/// never otherwise. Start it once the output that matters is written (or before: a reader
/// gone early is noticed just the same).
pub(crate) fn closed() -> impl Future<Output = ()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = std::thread::Builder::new()
        .name("stdout-reader".into())
        .spawn(move || {
            let stdout = std::io::stdout();
            loop {
                let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::empty())];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {
                        let events = fds[0].revents().unwrap_or(PollFlags::empty());
                        if events.intersects(PollFlags::POLLERR | PollFlags::POLLHUP) {
                            let _ = tx.send(());
                            return;
                        }
                        if events.contains(PollFlags::POLLNVAL) {
                            // No standard output at all: writing says so (exit 74).
                            return;
                        }
                    }
                    Err(Errno::EINTR) => {}
                    Err(_) => return,
                }
            }
        });
    async move {
        // No thread, or one that gave up: nothing to notice here.
        if watcher.is_err() || rx.await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
