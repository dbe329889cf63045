//! Logs and metrics: the catalog of every metric (publisher and service alike),
//! and, with the service, the tracing subscriber and the Prometheus recorder.

mod catalog;
#[cfg(feature = "service")]
mod recorder;
#[cfg(feature = "service")]
mod subscriber;

pub(crate) use self::catalog::*;
#[cfg(feature = "service")]
pub(crate) use self::recorder::metrics_handle;
#[cfg(feature = "service")]
pub use self::subscriber::init_tracing;
/// For the tests of this workspace (output only with `TEST_LOG`); not for users.
#[cfg(feature = "service")]
#[doc(hidden)]
pub use self::subscriber::init_tracing_for_tests;
