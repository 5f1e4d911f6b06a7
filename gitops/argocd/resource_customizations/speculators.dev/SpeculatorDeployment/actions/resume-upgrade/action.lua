-- Ask the operator to roll out the verifier or draft change its upgradePolicy paused (once per value).
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["speculators.dev/resume-requested"] = os.date("!%Y-%m-%dT%XZ")
return obj
