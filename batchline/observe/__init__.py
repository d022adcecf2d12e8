"""What a running pipeline shows of itself: progress records, metrics, the dashboard."""
