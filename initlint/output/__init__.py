"""Output formats (text, concise, json, sarif, github) and the rule pages generated from the rules' docs."""
