//! A `tracing` subscriber for tests that collects the events logged on the threads it is
//! the default of.

use std::sync::{Arc, Mutex};

/// Collects the events logged on this thread, as "field=value" text.
#[derive(Clone)]
pub(crate) struct Capture(pub(crate) Arc<Mutex<Vec<String>>>);

impl Default for Capture {
    fn default() -> Self {
        keep_callsites_interested();
        Capture(Arc::default())
    }
}

/// The global subscriber of this test binary: it records nothing, but answers every
/// callsite with "always". Without it, a callsite first reached on a thread with no
/// subscriber (another test's rank thread) while a single scoped `Capture` was alive is
/// cached as "never" by tracing-core (it then asks only that thread's default), and the
/// capture loses the event: this made `strangers_cost_the_real_ranks_nothing_and_are_logged`
/// fail in CI.
fn keep_callsites_interested() {
    struct Interested;
    impl tracing::Subscriber for Interested {
        fn register_callsite(&self, _: &tracing::Metadata<'_>) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::always()
        }
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            false
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // `Dispatch::new` registers it in tracing-core's list of dispatchers for good (the
        // global default is never dropped), so the list never holds a lone capture.
        let _ = tracing::dispatcher::set_global_default(tracing::Dispatch::new(Interested));
        tracing::callsite::rebuild_interest_cache();
    });
}

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = write!(self.0, "{}={:?} ", f.name(), v);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        let mut f = Fields(String::new());
        e.record(&mut f);
        self.0.lock().unwrap().push(f.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Capture {
    /// Whether any event logged so far contains `needle`.
    pub(crate) fn logged(&self, needle: &str) -> bool {
        self.0.lock().unwrap().iter().any(|l| l.contains(needle))
    }
}

impl Capture {
    /// The events logged so far that contain `needle`.
    pub(crate) fn count(&self, needle: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Every event logged so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}
