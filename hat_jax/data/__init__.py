"""Datasets of every stage, generated from seeds (cached where slow), and the SFT Grain pipeline.

`world_data.sft_records`, `world_data.rl_tasks` and `world_data.eval_items` build (or read from the
cache) the rejection-sampled SFT trajectories, the RL tasks and the four live-stream evaluation
suites (`suites.build_suite`); `pipeline.sft_dataset` turns trajectory records into HSA-augmented,
tokenised batches, packed by `packing` (several documents per row, with segment ids) or padded, with a
resumable iterator, and `pipeline.transform_shares` reports how
often each HSA transform was applied; `general.general_prompts` gives IFEval-style prompts for
on-policy distillation (`hub.load_tulu_prompts` reads real ones from the Hugging Face hub);
`corpus.pretraining_chats` and `corpus.tokenizer_training_texts` make the tiny base model's corpus.
"""
