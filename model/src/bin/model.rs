use model::effects::{EffectRules, EffectsModel};
use model::harness::{check, Stop};
fn main() {
    let m = EffectsModel::ci(EffectRules::Kernel);
    let r = check("effects", m.bounds(), m, Stop::Exhaustive);
    println!("{r}");
    for rules in [EffectRules::ReserveWhileApplying, EffectRules::RunnerLossRetriesApplying, EffectRules::CancelForgetsApplying] {
        let m = EffectsModel::ci(rules);
        let r = check("effects", m.bounds(), m, Stop::FirstFailure);
        println!("{rules:?}\n{r}");
    }
}
