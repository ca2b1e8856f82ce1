//! The operations' spans, at no cost when nothing would see them.
//!
//! A span that no subscriber wants is disabled, but with tracing's `log`
//! feature on (sqlx turns it on, so every build of this crate's tests and
//! benches has it) entering it at every poll and recording its fields still
//! run tracing's fallback to the `log` crate: 1,900 of the single-node
//! lock cycle's 41,100 instructions (BENCHMARKS.md, "Instructions per
//! cycle").
//! That fallback writes nothing unless a `log` logger takes DEBUG records
//! (the operations' spans are DEBUG, their enter and exit TRACE), so a span
//! is skipped when it is disabled and the `log` crate's level is below
//! DEBUG, and only then: what a subscriber or a logger sees is unchanged.

use std::future::Future;

use futures::future::Either;
use tracing::instrument::Instrumented;
use tracing::{Instrument, Span};

/// Whether nothing would see `span`: no subscriber wants it, and no `log`
/// logger takes its records.
pub(crate) fn unseen(span: &Span) -> bool {
    span.is_disabled() && log::max_level() < log::LevelFilter::Debug
}

/// `future` inside `span`, or bare when nothing would see the span.
pub(crate) fn within<F: Future>(future: F, span: &Span) -> Either<F, Instrumented<F>> {
    if unseen(span) {
        Either::Left(future)
    } else {
        Either::Right(future.instrument(span.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_a_subscriber_wants_is_seen_and_entered() {
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::debug_span!("seen");
            assert!(!unseen(&span));
            let inside = within(async { Span::current().is_disabled() }, &span);
            assert!(!futures::executor::block_on(inside), "run inside its span");
        });
    }

    #[test]
    fn a_span_nothing_wants_is_skipped_unless_a_logger_takes_debug() {
        // No subscriber, and no `log` logger in this test binary (the only
        // test here that sets the `log` crate's level).
        let span = tracing::debug_span!("unseen");
        assert!(unseen(&span));
        assert!(matches!(within(async {}, &span), Either::Left(_)));
        // A logger taking DEBUG records would get the span's through
        // tracing's `log` feature: the span is kept.
        log::set_max_level(log::LevelFilter::Debug);
        let kept = !unseen(&span) && matches!(within(async {}, &span), Either::Right(_));
        log::set_max_level(log::LevelFilter::Info);
        let info = unseen(&span);
        log::set_max_level(log::LevelFilter::Off);
        assert!(kept, "kept for a DEBUG logger");
        assert!(info, "skipped for an INFO logger");
    }
}
