"""Rule judges and RL rewards computed from the simulator's ground truth, with no model in the loop.

`rules.judge_episode` scores an `Episode` on every metric (Accuracy, Effectiveness, ADR, RC, TC,
LLM, TCO, Tool Rationality, Skill Selection) and tags high-severity errors; `facts` and `phrases`
hold the fact matching and Chinese phrase detectors it uses; `rewards.reward_components` /
`rewards.weighted_reward` turn a judgement into the HSA-RL reward (with `cot_length_penalty`);
`agreement.judge_agreement` reports agreement and Cohen's kappa with the hand-labelled episodes in
`hand_labels.yaml`; `reading.episode_reading` / `reading.reading_scores` count what shows reading directly
(valid tool and skill names, the right skill, the gold call chain completed), reported beside the metrics.
"""
