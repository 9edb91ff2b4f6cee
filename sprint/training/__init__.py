"""Fine-tuning with ms-swift: the SFT data check and the `swift sft` command."""
