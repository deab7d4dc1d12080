"""Execute Plans on real models over torch.distributed: what every family's executor shares (the
executor contract, clocks, collectives, buffer broadcasts, online planning, calibration).
"""
