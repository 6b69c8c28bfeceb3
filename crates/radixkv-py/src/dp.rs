//! `DpRouter`: `radixkv_index::dp::DpRouter` for a Python data-parallel
//! dispatcher (SGLang's `DataParallelController`, or any other engine's
//! front end): each rank's KV-event batches in, the rank for a request out.

use crate::errors::invalid;
use crate::ids::ids;
use pyo3::prelude::*;
use radixkv::routing::{BalanceRule, CacheAwarePolicy, NewPrefix};
use radixkv_index::dp::{DpError, DpPolicy, DpRouter as Inner, LoadMeasure, RankLoad};
use radixkv_py_macros::py_methods;
use std::sync::Arc;
use std::time::Duration;

/// What each data-parallel rank has cached, from the ranks' own KV events,
/// and the rank a request should go to: the longest prefix cached there or
/// already sent there, unless the load keeps it away (`balance`: under
/// `"global"`, when the busiest is above `balance_abs` and `balance_rel`
/// times the least busy, the least loaded; under `"above_mean"`, a rank
/// above `balance_abs` and `balance_rel` times the mean steps aside), except
/// a rank holding at least `keep_prefix_tokens` of the request, which keeps
/// it however loaded; ties to the less loaded. A request no rank holds any
/// of goes to the less loaded (`new_prefix="least_loaded"`) or to the rank
/// written least lately (`"least_written"`, under which the writes also
/// break the ties between equally loaded ranks).
#[pyclass(module = "radixkv._radixkv", frozen)]
pub(crate) struct DpRouter {
    inner: Arc<Inner>,
}

fn dp_error(py: Python<'_>, e: DpError) -> PyErr {
    invalid(py, e.to_string())
}

/// Whole-second-or-finer durations from Python floats (refusing what
/// `Duration` cannot hold).
fn seconds(py: Python<'_>, what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        invalid(
            py,
            format!("{what} must be a finite number of seconds of at least 0, not {s}"),
        )
    })
}

/// The value `name` means among the two an option `what` takes, or an
/// `InvalidArgument` naming both.
fn one_of<T: Copy>(py: Python<'_>, what: &str, name: &str, options: [(&str, T); 2]) -> PyResult<T> {
    match options.iter().find(|(n, _)| *n == name) {
        Some(&(_, v)) => Ok(v),
        None => Err(invalid(
            py,
            format!(
                "{what} must be {:?} or {:?}, not {name:?}",
                options[0].0, options[1].0
            ),
        )),
    }
}

#[py_methods]
impl DpRouter {
    /// A router over `ranks` ranks whose events name blocks of `page_size`
    /// tokens. `load` is what the thresholds weigh: `"requests"` or
    /// `"tokens"`. A routed request counts as sent to its rank for
    /// `pending_ttl_s` seconds (or until `settled`), at most
    /// `pending_tokens` tokens of them. `balance` is the imbalance rule:
    /// `"global"` (the busiest against the least busy; when imbalanced the
    /// least loaded takes the request) or `"above_mean"` (a rank above
    /// `balance_abs` and `balance_rel` times the mean steps aside). Under
    /// either, a rank holding (or sent) at least `keep_prefix_tokens` of a
    /// request's tokens keeps competing for it however loaded (`None`, the
    /// default: every rank is subject to the rule). `new_prefix` is where
    /// a request no rank holds or was sent any of goes: `"least_loaded"`
    /// (then the lower rank) or `"least_written"` (the rank whose routed
    /// requests brought the fewest new tokens lately, decayed over about
    /// the tokens the ranks hold; then the less loaded), which keeps
    /// separate caches' prefixes about as long as one shared cache would.
    #[new]
    // One parameter per keyword argument of the Python constructor.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (ranks, page_size, *, balance_abs=32, balance_rel=1.5, load="requests", pending_ttl_s=10.0, pending_tokens=1 << 20, balance="global", keep_prefix_tokens=None, new_prefix="least_loaded"))]
    fn new(
        py: Python<'_>,
        ranks: usize,
        page_size: usize,
        balance_abs: usize,
        balance_rel: f64,
        load: &str,
        pending_ttl_s: f64,
        pending_tokens: usize,
        balance: &str,
        keep_prefix_tokens: Option<usize>,
        new_prefix: &str,
    ) -> PyResult<Self> {
        let rule = one_of(
            py,
            "balance",
            balance,
            [
                ("global", BalanceRule::Global),
                ("above_mean", BalanceRule::AboveMean),
            ],
        )?;
        let new_prefix = one_of(
            py,
            "new_prefix",
            new_prefix,
            [
                ("least_loaded", NewPrefix::LeastLoaded),
                ("least_written", NewPrefix::LeastPressure),
            ],
        )?;
        let load = one_of(
            py,
            "load",
            load,
            [
                ("requests", LoadMeasure::Requests),
                ("tokens", LoadMeasure::Tokens),
            ],
        )?;
        let policy = DpPolicy {
            cache_aware: CacheAwarePolicy {
                rule,
                balance_abs,
                balance_rel,
                keep_prefix_tokens: keep_prefix_tokens.unwrap_or(usize::MAX),
                new_prefix,
                ..CacheAwarePolicy::default()
            },
            load,
            pending_ttl: seconds(py, "pending_ttl_s", pending_ttl_s)?,
            pending_tokens,
        };
        let inner = Inner::new(ranks, page_size, policy).map_err(|e| dp_error(py, e))?;
        Ok(DpRouter {
            inner: Arc::new(inner),
        })
    }

    /// Ranks.
    #[getter]
    fn ranks(&self) -> usize {
        self.inner.ranks()
    }

    /// Tokens per page (block).
    #[getter]
    fn page_size(&self) -> usize {
        self.inner.block_size()
    }

    /// Applies one KV-event batch exactly as rank `rank` published it (the
    /// msgpack payload: SGLang's or vLLM's encoding); with its sequence
    /// number `seq`, duplicates are dropped and a gap leaves the rank
    /// stale (scored 0) until its next `AllBlocksCleared`. Returns the
    /// events applied. Raises `InvalidArgument` for a payload that is not
    /// a batch or a rank past the router's; events it cannot apply are
    /// skipped (see `stale_ranks` and the return value).
    #[pyo3(signature = (rank, payload, seq=None))]
    fn ingest(
        &self,
        py: Python<'_>,
        rank: usize,
        payload: &[u8],
        seq: Option<u64>,
    ) -> PyResult<u64> {
        let inner = Arc::clone(&self.inner);
        // `payload` borrows the caller's `bytes`, immutable and held by
        // the call.
        py.detach(|| inner.ingest(rank, payload, seq))
            .map(|i| i.events)
            .map_err(|e| dp_error(py, e))
    }

    /// Per rank, the tokens of `token_ids`' longest prefix (whole pages,
    /// in `namespace`: `radixkv.namespace_for(lora_name, cache_salt)`) it
    /// holds on any medium.
    #[pyo3(signature = (token_ids, namespace=None))]
    fn scores(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        namespace: Option<String>,
    ) -> PyResult<Vec<usize>> {
        let t = ids(token_ids, "token_ids")?;
        let inner = Arc::clone(&self.inner);
        Ok(py.detach(|| inner.scores(t.as_slice(), namespace.as_deref())))
    }

    /// The rank to send a request of `token_ids` to (see the class docs);
    /// the request then counts as sent there. `loads`: each rank's
    /// `(requests, tokens)`, as SGLang's `DPBudget` keeps them (`None`: all
    /// idle); `active`: whether each rank takes requests (`None`: all).
    /// `None` when no rank is active.
    #[pyo3(signature = (token_ids, namespace=None, loads=None, active=None))]
    fn route(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        namespace: Option<String>,
        loads: Option<Vec<(usize, usize)>>,
        active: Option<Vec<bool>>,
    ) -> PyResult<Option<usize>> {
        let n = self.inner.ranks();
        let loads = loads.unwrap_or_else(|| vec![(0, 0); n]);
        let active = active.unwrap_or_else(|| vec![true; n]);
        if loads.len() != n || active.len() != n {
            return Err(invalid(
                py,
                format!(
                    "one load and one active flag per rank: {n} ranks, {} loads, {} flags",
                    loads.len(),
                    active.len()
                ),
            ));
        }
        let per_rank: Vec<RankLoad> = loads
            .iter()
            .zip(&active)
            .map(|(&(requests, tokens), &active)| RankLoad {
                requests,
                tokens,
                active,
            })
            .collect();
        let t = ids(token_ids, "token_ids")?;
        let inner = Arc::clone(&self.inner);
        py.detach(|| inner.route(t.as_slice(), namespace.as_deref(), &per_rank))
            .map(|c| c.map(|c| c.device))
            .map_err(|e| dp_error(py, e))
    }

    /// A request sent to `rank` is cached there (or was aborted): it no
    /// longer counts as sent.
    #[pyo3(signature = (token_ids, rank, namespace=None))]
    fn settled(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        rank: usize,
        namespace: Option<String>,
    ) -> PyResult<()> {
        let t = ids(token_ids, "token_ids")?;
        let inner = Arc::clone(&self.inner);
        py.detach(|| inner.settled(t.as_slice(), namespace.as_deref(), rank));
        Ok(())
    }

    /// Follows rank `rank`'s KV events on its sockets from now on, on a
    /// thread of the router's own (no GIL): `endpoint` its PUB endpoint
    /// (`tcp://HOST:PORT`, as SGLang's `--kv-events-config` names it),
    /// `replay_endpoint` its replay (ROUTER) endpoint, for the gaps and
    /// reconnections. Returns at once; the connection is made and retried
    /// in the background. A subscribed rank takes no `ingest`.
    #[pyo3(signature = (rank, endpoint, replay_endpoint=None, topic=""))]
    fn subscribe(
        &self,
        py: Python<'_>,
        rank: usize,
        endpoint: &str,
        replay_endpoint: Option<&str>,
        topic: &str,
    ) -> PyResult<()> {
        if !endpoint.starts_with("tcp://") {
            return Err(invalid(
                py,
                format!("endpoint {endpoint:?}: only tcp://HOST:PORT is supported"),
            ));
        }
        self.inner
            .subscribe(rank, endpoint, replay_endpoint, topic, Default::default())
            .map_err(|e| dp_error(py, e))
    }

    /// Ranks whose blocks are unknown since a gap in their stream.
    fn stale_ranks(&self) -> Vec<usize> {
        self.inner.stale_ranks()
    }

    /// Forgets everything rank `rank` held (it restarted or left).
    fn clear(&self, py: Python<'_>, rank: usize) -> PyResult<()> {
        let inner = Arc::clone(&self.inner);
        py.detach(move || inner.clear(rank))
            .map_err(|e| dp_error(py, e))
    }

    /// Requests counted as sent and not yet settled or expired.
    fn dispatched(&self) -> usize {
        self.inner.dispatched_len()
    }

    fn __repr__(&self) -> String {
        format!(
            "DpRouter(ranks={}, page_size={})",
            self.inner.ranks(),
            self.inner.block_size()
        )
    }
}
