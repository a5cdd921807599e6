//! Redlock on several independent Redis servers: being written.
