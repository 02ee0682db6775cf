//! Runs one model through stateright's breadth-first checker and turns the
//! result into a [`Report`]: state counts, depth, time, the verdict of every
//! property and, for each failure, the counterexample as a numbered sequence
//! of kernel inputs.

use core::fmt::{self, Debug, Display};
use core::hash::Hash;
use stateright::{Checker, Expectation, HasDiscoveries, Model};
use std::time::Instant;

/// How a model is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Bounded configurations with pinned state counts (CI).
    Ci,
    /// Larger bounds for local runs (`model --deep` or `MODEL_DEEP=1`).
    Deep,
}

impl Mode {
    /// `Deep` when `MODEL_DEEP` is set to anything but `0` or empty.
    pub fn from_env() -> Self {
        match std::env::var("MODEL_DEEP") {
            Ok(value) if !value.is_empty() && value != "0" => Self::Deep,
            _ => Self::Ci,
        }
    }
}

/// When the checker stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Explore the whole bounded space (state counts are then deterministic).
    Exhaustive,
    /// Stop as soon as this `always` or `eventually` property is violated
    /// (mutation runs). Stopping at the first failure of any property instead
    /// (`HasDiscoveries::AnyFailures`) would make the verdict on the targeted
    /// property depend on which thread found what first when a planted bug
    /// breaks several properties.
    Property(&'static str),
}

/// The verdict on one property.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `always`/`eventually`: no counterexample in the explored space.
    Holds,
    /// `sometimes`: an example path was found.
    Reached,
    /// `sometimes`: no reachable state satisfies it (a vacuity warning).
    NotReached,
    /// `always`/`eventually`: the numbered kernel inputs of a counterexample.
    Violated(Vec<String>),
    /// `always`/`eventually` when the run stopped at another failure first.
    Unknown,
}

/// One property's name, kind and verdict.
#[derive(Clone, Debug)]
pub struct PropertyReport {
    pub name: &'static str,
    pub expectation: Expectation,
    pub verdict: Verdict,
}

/// What one checker run found.
#[derive(Clone, Debug)]
pub struct Report {
    pub model: String,
    pub bounds: String,
    pub unique_states: usize,
    pub total_states: usize,
    pub max_depth: usize,
    pub seconds: f64,
    pub properties: Vec<PropertyReport>,
}

impl Report {
    /// Whether every property met its expectation.
    pub fn passed(&self) -> bool {
        self.properties
            .iter()
            .all(|p| matches!(p.verdict, Verdict::Holds | Verdict::Reached))
    }

    /// The counterexample found for `property`, if it was violated.
    pub fn counterexample(&self, property: &str) -> Option<&[String]> {
        self.properties
            .iter()
            .find(|p| p.name == property)
            .and_then(|p| match &p.verdict {
                Verdict::Violated(steps) => Some(steps.as_slice()),
                _ => None,
            })
    }

    /// The names of the properties that did not meet their expectation.
    pub fn failures(&self) -> Vec<&'static str> {
        self.properties
            .iter()
            .filter(|p| !matches!(p.verdict, Verdict::Holds | Verdict::Reached))
            .map(|p| p.name)
            .collect()
    }

    /// One table line: model, unique states, depth, seconds, properties.
    pub fn summary_line(&self) -> String {
        let count = |e: Expectation| {
            self.properties
                .iter()
                .filter(|p| p.expectation == e)
                .count()
        };
        format!(
            "{:<12} unique={:>8} total={:>9} depth={:>3} time={:>7.2}s  properties: {} always, {} sometimes, {} eventually  [{}]",
            self.model,
            self.unique_states,
            self.total_states,
            self.max_depth,
            self.seconds,
            count(Expectation::Always),
            count(Expectation::Sometimes),
            count(Expectation::Eventually),
            self.bounds,
        )
    }
}

impl Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary_line())?;
        for property in &self.properties {
            let kind = match property.expectation {
                Expectation::Always => "always",
                Expectation::Sometimes => "sometimes",
                Expectation::Eventually => "eventually",
            };
            let verdict = match &property.verdict {
                Verdict::Holds => "holds",
                Verdict::Reached => "reached",
                Verdict::NotReached => "NOT REACHED",
                Verdict::Violated(_) => "VIOLATED",
                Verdict::Unknown => "not decided (stopped at another failure)",
            };
            writeln!(f, "    {kind:<10} {verdict:<12} {}", property.name)?;
            if let Verdict::Violated(steps) = &property.verdict {
                let inputs = steps
                    .iter()
                    .filter(|s| !s.trim_start().starts_with("=>"))
                    .count();
                writeln!(f, "      counterexample ({inputs} kernel inputs):")?;
                for step in steps {
                    writeln!(f, "        {step}")?;
                }
            }
        }
        Ok(())
    }
}

/// A model whose final counterexample state can be summarised in one line.
pub trait Summarize: Model {
    /// A short description of `state` for the end of a counterexample.
    fn summarize(&self, state: &Self::State) -> String;
}

/// Checks `model` breadth-first on all available cores.
pub fn check<M>(name: &str, bounds: String, model: M, stop: Stop) -> Report
where
    M: Model + Summarize + Clone + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + Eq + 'static,
    M::Action: Debug + Display + Clone + PartialEq,
{
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let properties = model.properties();
    let started = Instant::now();
    let mut builder = model.clone().checker().threads(threads);
    if let Stop::Property(name) = stop {
        builder = builder.finish_when(HasDiscoveries::AnyOf([name].into_iter().collect()));
    }
    let checker = builder.spawn_bfs().join();
    let seconds = started.elapsed().as_secs_f64();
    let discoveries = checker.discoveries();
    let any_failure = properties
        .iter()
        .any(|p| p.expectation.discovery_is_failure() && discoveries.contains_key(p.name));
    let properties = properties
        .iter()
        .map(|property| {
            let found = discoveries.get(property.name);
            let verdict = match (property.expectation.clone(), found) {
                (Expectation::Sometimes, Some(_)) => Verdict::Reached,
                (Expectation::Sometimes, None) => Verdict::NotReached,
                (expectation, Some(path)) => {
                    // stateright's paths are not minimal (a later discovery in the
                    // same batch overwrites an earlier one); for a safety property
                    // print the shortest counterexample instead.
                    let shortest = (expectation == Expectation::Always)
                        .then(|| shortest_violation(&model, property.condition))
                        .flatten();
                    let steps = shortest.unwrap_or_else(|| path.clone().into_vec());
                    let mut lines = Vec::new();
                    let mut last = None;
                    for (state, action) in steps {
                        if let Some(action) = action {
                            lines.push(format!("{:>2}. {action}", lines.len() + 1));
                        }
                        last = Some(state);
                    }
                    if let Some(state) = last {
                        lines.push(format!("    => {}", model.summarize(&state)));
                    }
                    Verdict::Violated(lines)
                }
                (_, None) if stop != Stop::Exhaustive && any_failure => Verdict::Unknown,
                (_, None) => Verdict::Holds,
            };
            PropertyReport {
                name: property.name,
                expectation: property.expectation.clone(),
                verdict,
            }
        })
        .collect();
    Report {
        model: name.to_owned(),
        bounds,
        unique_states: checker.unique_state_count(),
        total_states: checker.state_count(),
        max_depth: checker.max_depth(),
        seconds,
        properties,
    }
}

/// A path as (state, action taken from it) pairs, the last action `None`.
type Steps<M> = Vec<(<M as Model>::State, Option<<M as Model>::Action>)>;
/// The state a state was first reached from, and the action taken.
type Parent<M> = Option<(<M as Model>::State, <M as Model>::Action)>;

/// The states explored at most when shortening a counterexample.
const SHORTEST_STATE_LIMIT: usize = 2_000_000;

/// A shortest path (breadth-first, one thread) from an initial state to a
/// state that violates `condition`, as (state, action taken from it) pairs
/// like stateright's `Path::into_vec`.
fn shortest_violation<M>(model: &M, condition: fn(&M, &M::State) -> bool) -> Option<Steps<M>>
where
    M: Model,
    M::State: Hash + Clone + Eq,
    M::Action: Clone,
{
    use std::collections::{HashMap, VecDeque};
    let mut parents: HashMap<M::State, Parent<M>> = HashMap::new();
    let mut queue = VecDeque::new();
    for init in model.init_states() {
        if parents.insert(init.clone(), None).is_none() {
            queue.push_back(init);
        }
    }
    let mut actions = Vec::new();
    while let Some(state) = queue.pop_front() {
        if !condition(model, &state) {
            let mut path = vec![(state.clone(), None)];
            let mut cursor = state;
            while let Some(Some((parent, action))) = parents.get(&cursor) {
                path.push((parent.clone(), Some(action.clone())));
                cursor = parent.clone();
            }
            path.reverse();
            return Some(path);
        }
        if parents.len() > SHORTEST_STATE_LIMIT {
            return None;
        }
        model.actions(&state, &mut actions);
        for action in actions.drain(..) {
            let Some(next) = model.next_state(&state, action.clone()) else {
                continue;
            };
            if !model.within_boundary(&next) || parents.contains_key(&next) {
                continue;
            }
            parents.insert(next.clone(), Some((state.clone(), action)));
            queue.push_back(next);
        }
    }
    None
}
