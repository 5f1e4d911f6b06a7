-- Ask the operator to retrain the draft for the verifier as it resolves now (once per value).
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["speculators.dev/retrain-requested"] = os.date("!%Y-%m-%dT%XZ")
return obj
