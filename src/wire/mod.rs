//! The wire: the only place that knows the formats of Redis's replies.

pub(crate) mod info;
