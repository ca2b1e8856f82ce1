//! PostgreSQL fenced writes (feature `postgres`). Placeholder: filled in with
//! the adapter.
