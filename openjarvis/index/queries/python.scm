; Definitions and references for Python (captures: @definition.KIND + @name, @reference.KIND).
(class_definition name: (identifier) @name) @definition.class
(function_definition name: (identifier) @name) @definition.function
(module (assignment left: (identifier) @name) @definition.constant)
(class_definition body: (block (assignment left: (identifier) @name) @definition.constant))
(call function: (identifier) @reference.call)
(call function: (attribute attribute: (identifier) @reference.call))
(import_statement name: (dotted_name (identifier) @reference.module))
(import_from_statement name: (dotted_name (identifier) @reference.import))
(import_from_statement module_name: (dotted_name (identifier) @reference.module))
(import_from_statement module_name: (relative_import (dotted_name (identifier) @reference.module)))
(aliased_import name: (dotted_name (identifier) @reference.import))
(argument_list (identifier) @reference.use)
(class_definition superclasses: (argument_list (identifier) @reference.type))
(class_definition superclasses: (argument_list (attribute attribute: (identifier) @reference.type)))
(type (identifier) @reference.type)
(attribute object: (identifier) @reference.use)
(decorator (identifier) @reference.call)
(decorator (attribute attribute: (identifier) @reference.call))
