"""The prediction's answer from the recorded run: per policy, peaks, the smallest capacity, whether
it fits (through replay/evaluation.py); what holds memory at the peak and over the run; the
verdict's data. Data only: every text, markdown and page is report/'s."""
