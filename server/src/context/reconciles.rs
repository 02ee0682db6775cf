//! The reconcile passes in flight (`children::controller`): one per claimed
//! `resource_queue` row, each holding one execution slot of the shared
//! capacity (`PI_WORKFLOWS_MAX_WORKERS`) from its admission until its child
//! is gone.
//!
//! Invariants:
//! - A pass is registered by the admission round that committed its claim,
//!   before its child is spawned, and removed only after its child's
//!   process group is gone; `live()` counts it the whole time.
//! - At most one pass per resource uid is in flight in this server.

use crate::process::ProcessIdentity;
use kernel::ids::Digest;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// One reconcile pass under a live claim.
#[derive(Debug)]
pub struct Pass {
    pub uid: String,
    pub controller: String,
    pub key: String,
    /// The claim's generation and token hash: every message is fenced by them.
    pub generation: u64,
    pub token_hash: Digest,
    /// The resource version and generation the pass read (its CAS base).
    pub read_version: u64,
    pub resource_generation: u64,
    /// The pass's deadline (`timeoutMs` of its launch).
    pub timeout_ms: u64,
    /// The effect key this pass ensured, if any (one effect per pass).
    pub effect_key: Mutex<Option<String>>,
    /// The child's process identity once spawned.
    pub identity: Mutex<Option<ProcessIdentity>>,
    /// The server stops the pass (it is shutting down).
    pub interrupted: AtomicBool,
}

impl Pass {
    pub fn identity(&self) -> Option<ProcessIdentity> {
        self.identity.lock().expect("identity lock").clone()
    }

    pub fn is_interrupted(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
    }
}

/// The passes in flight, by resource uid.
#[derive(Debug, Default)]
pub struct Reconciles {
    passes: Mutex<BTreeMap<String, Arc<Pass>>>,
}

impl Reconciles {
    /// Registers a pass; `false` when its resource already has one here.
    pub fn register(&self, pass: Arc<Pass>) -> bool {
        let mut passes = self.passes.lock().expect("reconciles lock");
        if passes.contains_key(&pass.uid) {
            return false;
        }
        passes.insert(pass.uid.clone(), pass);
        true
    }

    pub fn remove(&self, uid: &str) {
        self.passes.lock().expect("reconciles lock").remove(uid);
    }

    pub fn is_live(&self, uid: &str) -> bool {
        self.passes
            .lock()
            .expect("reconciles lock")
            .contains_key(uid)
    }

    /// Passes in flight (each holds a slot).
    pub fn live(&self) -> usize {
        self.passes.lock().expect("reconciles lock").len()
    }

    pub fn all(&self) -> Vec<Arc<Pass>> {
        self.passes
            .lock()
            .expect("reconciles lock")
            .values()
            .cloned()
            .collect()
    }
}
