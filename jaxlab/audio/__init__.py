"""Speech: Whisper's log-mel front end (`mel`), the ASR entry point (`asr`), speech synthesis with espeak-ng or
piper (`tts`), and seeded perturbations: disfluencies, homophones, prosody, noise at a given SNR (`perturb`)."""
