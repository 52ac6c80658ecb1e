"""The probe: one forward and one backward pass on the chosen device, and the statistics it keeps."""
