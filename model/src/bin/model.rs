use model::decisions::{DecisionRules, DecisionsModel};
use model::harness::{check, Stop};
fn main() {
    let m = DecisionsModel::ci(DecisionRules::Kernel);
    let r = check("decisions", m.bounds(), m, Stop::Exhaustive);
    println!("{r}");
    for rules in [DecisionRules::AnswerAfterDeadlineWins, DecisionRules::SecondAnswerAlsoContinues, DecisionRules::DeadlineIgnoresPause, DecisionRules::CheckpointAnswerIgnoresDecision] {
        let m = DecisionsModel::ci(rules);
        let r = check("decisions", m.bounds(), m, Stop::FirstFailure);
        println!("{rules:?}\n{r}");
    }
}
