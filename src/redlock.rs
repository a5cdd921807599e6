//! Redlock (feature `redlock`): being written.
