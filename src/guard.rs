//! What every guard of a queue entry offers: its token, its key, `lost()`, the ownership
//! check and guarded writes. Written once, for the guards of every recipe.

/// Implements the common methods of a guard type that has a `held: Held` field. `$what` names
/// what the guard holds in the docs ("the lock", "the permit").
macro_rules! entry_guard {
    ($guard:ty, $what:literal) => {
        impl $guard {
            #[doc = concat!("The fencing token of ", $what, ": unique, strictly increasing in ")]
            #[doc = "the order entries are granted, across all clients, and above every token"]
            #[doc = "of an earlier store epoch (etcd: our key's create revision, carried above"]
            #[doc = "the epoch's start; the create revision itself is the position of"]
            #[doc = "[`entry`](Self::entry), [`Entry::position`](crate::backend::Entry::position))."]
            pub fn fencing_token(&self) -> $crate::FencingToken {
                self.held.entry().token()
            }

            /// The name of the recipe our entry belongs to.
            pub fn name(&self) -> &str {
                self.held.queue()
            }

            /// Our entry's key.
            pub fn key(&self) -> &str {
                self.held.entry().key()
            }

            /// The queue entry as it was when granted.
            pub fn entry(&self) -> &$crate::backend::Entry {
                self.held.entry()
            }

            #[doc = concat!("Resolves when ", $what, " is lost: the session under it is lost, ")]
            #[doc = "or our entry was deleted from outside"]
            #[doc = "([`LostReason::EntryDeleted`](crate::LostReason::EntryDeleted))."]
            #[doc = "Run protected work in a `select!` against it."]
            ///
            /// Session loss is heard at once (at the lease deadline at the latest); a deleted
            /// entry as soon as the backend reports the deletion (one watch on our own entry,
            /// opened when this future is first polled). Our own release (or drop) is not a
            /// loss: a `lost()` future that outlives the guard resolves only when the session
            /// ends ([`LostReason::Closed`](crate::LostReason::Closed) after a close).
            ///
            /// # Cancel safety
            /// Cancel safe: dropping it only stops this one observer.
            pub fn lost(
                &self,
            ) -> impl ::std::future::Future<Output = $crate::LostReason> + Send + Sync + 'static
            {
                ::sync_wrapper::SyncFuture::new(self.held.lost())
            }

            /// Whether our entry still exists with our token, checked against the backend now.
            ///
            /// # Errors
            /// Backend errors after retries.
            ///
            /// # Cancel safety
            /// Cancel safe: it only reads.
            pub fn is_owner(
                &self,
            ) -> impl ::std::future::Future<Output = $crate::Result<bool>> + Send + Sync + '_ {
                ::sync_wrapper::SyncFuture::new(
                    self.held
                        .session()
                        .backend()
                        .guarded(self.held.entry(), &[]),
                )
            }

            #[doc = concat!("Applies `ops` atomically in the backend only while we still hold ", $what, ":")]
            /// the ownership check (our entry's token) is in the same transaction as the
            /// writes, so they cannot land after our entry is gone.
            ///
            /// The writes may not touch the recipe's own keys: a key under its name
            /// (`<name>/...`) is refused before anything is sent
            /// ([`Error::WriteIntoQueue`](crate::Error::WriteIntoQueue)), since it would put an
            /// entry without a lease into the queue, or detach ours from its lease.
            ///
            /// # Errors
            /// Not applied: [`Error::NotOwner`](crate::Error::NotOwner) (our entry is gone),
            /// [`Error::WriteIntoQueue`](crate::Error::WriteIntoQueue),
            /// [`Error::Backend`](crate::Error::Backend).
            /// [`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown): the writes may have
            /// been applied (the answer was lost), never after our entry was gone; read to find
            /// out.
            ///
            /// # Cancel safety
            /// If the future is dropped, the writes may or may not have been applied, but
            /// never after our entry was gone.
            pub fn write<'a>(
                &'a self,
                ops: &'a [$crate::backend::WriteOp],
            ) -> impl ::std::future::Future<Output = $crate::Result<()>> + Send + Sync + 'a {
                ::sync_wrapper::SyncFuture::new(self.held.write(ops))
            }
        }
    };
}

/// Implements `release(self)` for a guard type with a `held: Held` field: the explicit
/// release of a recipe's entry (a `MutexGuard`, whose release has its own span).
macro_rules! release_guard {
    ($guard:ty, $what:literal) => {
        impl $guard {
            #[doc = concat!("Releases ", $what, ": deletes our entry if it is still ours (never")]
            /// a successor's).
            ///
            /// # Errors
            /// [`Error::NotOwner`](crate::Error::NotOwner) if the entry was already gone: it
            /// had been lost before this call (lease ended, entry deleted from outside), so the
            /// work it protected may have overlapped others'; nothing was deleted. Any other
            /// error: the delete goes on in the background until it is confirmed or the
            /// session is lost.
            ///
            /// # Cancel safety
            /// Cancel safe: if the future is dropped before the delete answered, a background
            /// task finishes the release, as when the guard is dropped.
            pub fn release(
                self,
            ) -> impl ::std::future::Future<Output = $crate::Result<()>> + Send + Sync + 'static
            {
                use ::tracing::Instrument;
                let span = ::tracing::debug_span!("baton.release", key = %self.held.entry().key());
                ::sync_wrapper::SyncFuture::new(self.held.release().instrument(span))
            }
        }
    };
}

pub(crate) use {entry_guard, release_guard};
