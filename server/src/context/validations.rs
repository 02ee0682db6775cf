//! The validation children in flight (spawned by `children::validator`).

use kernel::ids::SubmissionId;
use std::collections::BTreeMap;
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

    /// Whether `submission_id` has a child in flight.
    pub fn is_in_flight(&self, submission_id: &SubmissionId) -> bool {
        let in_flight = self.in_flight.lock().expect("validations lock");
        in_flight.contains_key(submission_id)
    }
}
