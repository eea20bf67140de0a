"""The model clients: embedders and the HTTP model servers' wire formats."""
