"""tools/report"""
