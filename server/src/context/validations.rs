//! The validation children in flight (spawned by `children::validator`).

use kernel::ids::SubmissionId;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// The validation children in flight, by submission, with whether each
/// takes an execution slot of its own.
#[derive(Debug, Default)]
pub struct Validations {
    pub(crate) in_flight: Mutex<BTreeMap<SubmissionId, bool>>,
}

impl Validations {
    /// The execution slots that children in flight take.
    pub fn slots_taken(&self) -> usize {
        let in_flight = self.in_flight.lock().expect("validations lock");
        in_flight.values().filter(|takes_slot| **takes_slot).count()
    }

    /// How many children are in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.lock().expect("validations lock").len()
    }

    /// The submissions that have a child in flight now.
    pub fn in_flight_now(&self) -> BTreeSet<SubmissionId> {
        let in_flight = self.in_flight.lock().expect("validations lock");
        in_flight.keys().cloned().collect()
    }
}
